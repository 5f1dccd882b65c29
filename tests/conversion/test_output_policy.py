"""convert.py never deletes or replaces what it did not write: the data-loss cases of issue 11, through the CLI.

Each case snapshots every file the user had (path -> bytes) and checks all of them are still there, byte-identical.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanochat_hf.conversion import to_native

SCRIPT = Path(__file__).parents[2] / "scripts" / "convert.py"


@pytest.fixture(scope="module")
def convert():
    main = runpy.run_path(str(SCRIPT), run_name="convert")["main"]

    def run(*argv, capsys) -> tuple[int, str]:
        code = main([str(a) for a in argv])
        err = capsys.readouterr().err.strip()
        assert "\n" not in err, err
        return code, err

    return run


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_kept(root: Path, before: dict[str, bytes]) -> None:
    after = snapshot(root)
    for name, data in before.items():
        assert name in after, f"{name} was deleted"
        assert after[name] == data, f"{name} was changed"


@pytest.fixture
def user_base(nanochat_base, tmp_path) -> Path:
    """A private copy of the nanochat base dir (tokenizer/, base_checkpoints/d2) plus a file of the user's."""
    base = shutil.copytree(nanochat_base, tmp_path / "nanochat")
    (base / "report.md").write_text("the user's notes")
    return base


def from_nanochat_args(base: Path, output: Path, *extra) -> list:
    return [
        "from-nanochat",
        "--checkpoint-dir",
        base / "base_checkpoints" / "d2",
        "--output",
        output,
        "--trust-pickle",
        *extra,
    ]


def test_output_is_the_users_nanochat_base_dir(user_base, convert, capsys):
    before = snapshot(user_base)
    code, err = convert(*from_nanochat_args(user_base, user_base), capsys=capsys)
    assert code == 2 and "contains the source" in err and "--overwrite" in err and str(user_base) in err
    assert snapshot(user_base) == before
    # with --overwrite the converted files are added, and everything the user had stays
    code, err = convert(*from_nanochat_args(user_base, user_base, "--overwrite"), capsys=capsys)
    assert code == 0, err
    assert_kept(user_base, before)
    assert (user_base / "model.safetensors").is_file()


def test_output_is_or_is_inside_the_source_checkpoint_dir(user_base, convert, capsys):
    ckpt = user_base / "base_checkpoints" / "d2"
    before = snapshot(user_base)
    code, err = convert(*from_nanochat_args(user_base, ckpt), capsys=capsys)
    assert code == 2 and "is the source" in err
    code, err = convert(*from_nanochat_args(user_base, ckpt / "hf"), capsys=capsys)
    assert code == 2 and "is inside the source" in err
    code, err = convert(
        *from_nanochat_args(user_base, user_base / "tokenizer", "--tokenizer-dir", user_base / "tokenizer"),
        capsys=capsys,
    )
    assert code == 2 and "is the source" in err
    assert snapshot(user_base) == before
    code, err = convert(*from_nanochat_args(user_base, ckpt, "--overwrite"), capsys=capsys)
    assert code == 0, err
    assert_kept(user_base, before)
    assert load_file(ckpt / "model.safetensors").keys()


def test_output_holding_user_files(user_base, convert, capsys, tmp_path):
    out = tmp_path / "models"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep me")
    (out / "sub" / "data.bin").write_bytes(os.urandom(64))
    before = snapshot(out)
    code, err = convert(*from_nanochat_args(user_base, out), capsys=capsys)
    assert code == 2 and "is not empty" in err and "--overwrite" in err
    assert snapshot(out) == before
    code, err = convert(*from_nanochat_args(user_base, out, "--overwrite"), capsys=capsys)
    assert code == 0, err
    assert_kept(out, before)
    # running again into the now converted folder: refused, then replaced in place with --overwrite
    converted = snapshot(out)
    code, err = convert(*from_nanochat_args(user_base, out, "--step", "2"), capsys=capsys)
    assert code == 2 and snapshot(out) == converted
    code, err = convert(*from_nanochat_args(user_base, out, "--step", "2", "--overwrite"), capsys=capsys)
    assert code == 0 and json.loads((out / "nanochat_meta.json").read_text())["step"] == 2
    assert_kept(out, before)


def test_output_is_a_file(user_base, convert, capsys, tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"user data")
    code, err = convert(*from_nanochat_args(user_base, target, "--overwrite"), capsys=capsys)
    assert code == 2 and "not a directory" in err and target.read_bytes() == b"user data"


def test_to_native(hf_dir, convert, capsys, tmp_path):
    model = shutil.copytree(hf_dir, tmp_path / "hf")
    source = snapshot(model)
    out = tmp_path / "native"
    out.mkdir()
    (out / "README.md").write_text("mine")
    code, err = convert("to-native", "--model", model, "--output", out, capsys=capsys)
    assert code == 2 and "is not empty" in err and snapshot(out) == {"README.md": b"mine"}
    code, err = convert("to-native", "--model", model, "--output", out, "--overwrite", capsys=capsys)
    assert code == 0 and (out / "README.md").read_text() == "mine"
    # into the source folder: refused, and even --overwrite never replaces the source's config / weights
    code, err = convert("to-native", "--model", model, "--output", model, capsys=capsys)
    assert code == 2 and "is the source" in err
    code, err = convert("to-native", "--model", model, "--output", model, "--overwrite", capsys=capsys)
    assert code == 2 and "refusing to replace a source file" in err
    assert snapshot(model) == source
    assert not [p for p in model.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_to_nanochat_over_existing_files(hf_dir, convert, capsys, tmp_path):
    out, tokenizer = tmp_path / "base_checkpoints" / "d2", tmp_path / "tokenizer"  # nanochat's layout
    out.mkdir(parents=True)
    tokenizer.mkdir()
    for name in ("model_000005.pt", "meta_000005.json", "model_000001.pt"):
        (out / name).write_bytes(b"the user's " + name.encode())
    for name in ("tokenizer.pkl", "token_bytes.pt"):
        (tokenizer / name).write_bytes(b"the user's " + name.encode())
    before = snapshot(tmp_path)
    code, err = convert("to-nanochat", "--model", hf_dir, "--output", out, capsys=capsys)
    assert code == 2 and "model_000005.pt: already exists" in err and "--overwrite" in err
    assert snapshot(tmp_path) == before
    # another step: the checkpoint is new, but the tokenizer files there are the user's (different): refused whole
    code, err = convert("to-nanochat", "--model", hf_dir, "--output", out, "--step", "7", capsys=capsys)
    assert code == 2 and f"{tokenizer}/token" in err and "already exists" in err
    assert snapshot(tmp_path) == before
    tok_out = tmp_path / "tok"
    tok_out.mkdir()
    (tok_out / "token_bytes.pt").write_bytes(b"mine")
    code, err = convert(
        "to-nanochat", "--model", hf_dir, "--output", out, "--step", "7", "--tokenizer-output", tok_out, capsys=capsys
    )
    assert code == 2 and "token_bytes.pt: already exists" in err
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("tok/")} == before
    assert snapshot(tok_out) == {"token_bytes.pt": b"mine"}
    # --overwrite replaces exactly the files it writes; the other step stays
    code, err = convert("to-nanochat", "--model", hf_dir, "--output", out, "--overwrite", capsys=capsys)
    assert code == 0, err
    assert (out / "model_000001.pt").read_bytes() == before["base_checkpoints/d2/model_000001.pt"]
    assert torch.load(out / "model_000005.pt", weights_only=True).keys()


def test_same_tokenizer_again_is_not_a_conflict(hf_dir, tmp_path, convert, capsys):
    out = tmp_path / "base_checkpoints" / "d2"
    assert convert("to-nanochat", "--model", hf_dir, "--output", out, capsys=capsys)[0] == 0
    tokenizer = snapshot(tmp_path / "tokenizer")
    assert convert("to-nanochat", "--model", hf_dir, "--output", out, "--step", "9", capsys=capsys)[0] == 0
    assert (out / "model_000009.pt").is_file() and snapshot(tmp_path / "tokenizer") == tokenizer


def test_a_failure_while_writing_leaves_the_output_as_it_was(hf_dir, tmp_path, monkeypatch):
    out = tmp_path / "native"
    to_native(hf_dir, out)
    before = snapshot(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("nanochat_hf.conversion.native.save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        to_native(hf_dir, out, overwrite=True)
    assert snapshot(out) == before and not [p for p in out.iterdir() if p.name.startswith(".")]
    with pytest.raises(OSError, match="No space left"):
        to_native(hf_dir, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["native"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_keep_the_umask_mode(nanochat_base, hf_dir, tmp_path, umask):
    from nanochat_hf.conversion import from_nanochat, to_nanochat

    old = os.umask(umask)
    try:
        hf = from_nanochat(
            nanochat_base / "base_checkpoints" / "d2", tmp_path / "hf", nanochat_base / "tokenizer", trust_pickle=True
        )
        nc = to_nanochat(hf_dir, tmp_path / "base_checkpoints" / "nc")
        existing = tmp_path / "existing"
        existing.mkdir()
        native = to_native(hf_dir, existing)  # written into an existing folder: files moved in one by one
    finally:
        os.umask(old)
    files, dirs = 0o666 & ~umask, 0o777 & ~umask
    checked = [
        hf / "model.safetensors",
        hf / "config.json",
        hf / "tokenizer.json",
        hf / "nanochat_meta.json",
        nc / "model_000005.pt",
        nc / "meta_000005.json",
        tmp_path / "tokenizer" / "tokenizer.pkl",
        tmp_path / "tokenizer" / "token_bytes.pt",
        native / "model.safetensors",
        native / "tokenizer.json",
    ]
    for path in checked:
        assert stat.S_IMODE(path.stat().st_mode) == files, (path, oct(path.stat().st_mode))
    for path in (hf, nc, tmp_path / "tokenizer"):
        assert stat.S_IMODE(path.stat().st_mode) == dirs, (path, oct(path.stat().st_mode))
