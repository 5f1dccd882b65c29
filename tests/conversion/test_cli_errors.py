"""Bad input to scripts/convert.py: one line on stderr naming the file / field / value, no traceback, exit code 2,
nothing written. Run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "convert.py"


def run(tmp_path: Path, *args) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    return result.returncode, result.stderr.strip().splitlines()


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def edit_meta(ckpt: Path, **changes) -> None:
    meta = json.loads((ckpt / "meta_000005.json").read_text())
    meta["model_config"].update(changes)
    (ckpt / "meta_000005.json").write_text(json.dumps(meta))


FROM_NANOCHAT_CASES = {  # name: (break the checkpoint copy, words the error line must contain)
    "n_layer two": (
        lambda c: edit_meta(c, n_layer="two"),
        ["meta_000005.json", "'n_layer'", "'two'", "positive integer"],
    ),
    "n_embd negative": (lambda c: edit_meta(c, n_embd=-64), ["meta_000005.json", "'n_embd'", "-64"]),
    "indivisible heads": (lambda c: edit_meta(c, n_head=3), ["meta_000005.json", "divisible"]),
    "meta is a list": (lambda c: (c / "meta_000005.json").write_text("[1]"), ["meta_000005.json", "JSON object"]),
}


@pytest.mark.parametrize("case", list(FROM_NANOCHAT_CASES))
def test_bad_nanochat_meta(case, nanochat_base, tmp_path):
    breaker, words = FROM_NANOCHAT_CASES[case]
    base = shutil.copytree(nanochat_base, tmp_path / "nanochat")
    breaker(base / "base_checkpoints" / "d2")
    code, err = run(
        tmp_path,
        "from-nanochat",
        "--checkpoint-dir",
        base / "base_checkpoints" / "d2",
        "--output",
        tmp_path / "hf",
        "--trust-pickle",
    )
    assert code == 2 and len(err) == 1 and err[0].startswith("convert: error: "), err
    assert all(w in err[0] for w in words), err
    assert not (tmp_path / "hf").exists()


HF_CASES = {  # name: (break the model dir copy, subcommand, words the error line must contain)
    "config n_layer two": (
        lambda d: edit_json(d / "config.json", n_layer="two"),
        "to-native",
        ["config.json", "'n_layer'", "'two'"],
    ),
    "config vocab zero": (
        lambda d: edit_json(d / "config.json", vocab_size=0),
        "to-nanochat",
        ["config.json", "'vocab_size'", "0"],
    ),
    "native config without hidden_size": (
        lambda d: edit_json(d / "config.json", model_type="nanochat"),
        "to-nanochat",
        ["config.json", "'hidden_size'"],
    ),
    "corrupt safetensors": (
        lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64),
        "to-nanochat",
        ["model.safetensors", "cannot be read as safetensors"],
    ),
    "damaged tokenizer.json": (
        lambda d: (d / "tokenizer.json").write_text('{"model": '),
        "to-nanochat",
        ["tokenizer.json", "cannot be loaded"],
    ),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_model_dir(case, hf_dir, tmp_path):
    breaker, command, words = HF_CASES[case]
    model = shutil.copytree(hf_dir, tmp_path / "model")
    breaker(model)
    out = tmp_path / "base_checkpoints" / "out"  # nanochat's layout (to-nanochat puts the tokenizer beside it)
    code, err = run(tmp_path, command, "--model", model, "--output", out)
    assert code == 2 and len(err) == 1 and err[0].startswith("convert: error: "), err
    assert all(w in err[0] for w in words), err
    assert not out.exists() and not (tmp_path / "tokenizer").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["to-nanochat", "--model", "m", "--output", "o", "--step", "-1"], ["--step", "'-1'", "non-negative"]),
        (["from-nanochat", "--checkpoint-dir", "c", "--output", "o", "--overwrite", "--dtype", "int8"], ["--dtype"]),
        (["to-native", "--model", "m"], ["--output", "required"]),
        (["to-gguf"], ["invalid choice: 'to-gguf'"]),
    ],
)
def test_bad_command_line_is_one_line(tmp_path, args, words):
    code, err = run(tmp_path, *args)
    # argparse names the subcommand's parser "convert <subcommand>"
    assert code == 2 and len(err) == 1 and err[0].startswith("convert") and ": error: " in err[0], err
    assert all(w in err[0] for w in words), err


def test_a_missing_source_is_one_line(tmp_path):
    code, err = run(tmp_path, "to-native", "--model", tmp_path / "nowhere", "--output", tmp_path / "out")
    assert code == 2 and err == [f"convert: error: {tmp_path / 'nowhere'}: model directory not found"], err


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    """Only bad input is turned into one line: an error of ours (here a RuntimeError) reaches the user whole."""
    import nanochat_hf.conversion

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(nanochat_hf.conversion, "to_native", broken)
    main = runpy.run_path(str(SCRIPT))["main"]
    with pytest.raises(RuntimeError, match="a bug"):
        main(["to-native", "--model", str(tmp_path), "--output", str(tmp_path / "out")])
