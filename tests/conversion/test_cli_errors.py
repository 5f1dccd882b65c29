"""Bad input to scripts/convert.py: one line on stderr naming the file / field / value, no traceback, exit code 2,
nothing written. Run as a user runs it, a subprocess, for one case of each kind (a bad checkpoint, a bad command
line); the other cases call the script's main() in this process (an exception escaping it fails the test just the
same)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "convert.py"


def run(tmp_path: Path, *args) -> tuple[int, list[str]]:
    """A fresh process, as a user runs it: exit code and stderr lines, which hold no traceback."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr.strip().splitlines()


@pytest.fixture
def run_here(load_script, capsys, monkeypatch):
    """run_here(tmp_path, *args): main(args) in this process, from tmp_path: exit code and stderr lines."""
    main = load_script("convert").main

    def run_in(tmp_path: Path, *args) -> tuple[int, list[str]]:
        monkeypatch.chdir(tmp_path)
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err.strip().splitlines()

    return run_in


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def edit_meta(ckpt: Path, **changes) -> None:
    meta = json.loads((ckpt / "meta_000005.json").read_text())
    meta["model_config"].update(changes)
    (ckpt / "meta_000005.json").write_text(json.dumps(meta))


SUB, IN = True, False
FROM_NANOCHAT_CASES = {  # name: (subprocess?, break the checkpoint copy, words the error line must contain)
    "n_layer two": (
        SUB,
        lambda c: edit_meta(c, n_layer="two"),
        ["meta_000005.json", "'n_layer'", "'two'", "positive integer"],
    ),
    "n_embd negative": (IN, lambda c: edit_meta(c, n_embd=-64), ["meta_000005.json", "'n_embd'", "-64"]),
    "indivisible heads": (IN, lambda c: edit_meta(c, n_head=3), ["meta_000005.json", "divisible"]),
    "meta is a list": (
        IN,
        lambda c: (c / "meta_000005.json").write_text("[1]"),
        ["meta_000005.json", "JSON object"],
    ),
}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if FROM_NANOCHAT_CASES[c][0] else c for c in FROM_NANOCHAT_CASES]
)
def test_bad_nanochat_meta(case, nanochat_base, tmp_path, run_here):
    """The subprocess cases are slow: a fresh convert.py process (seconds of imports) is what they test, one per
    command and kind."""
    in_subprocess, breaker, words = FROM_NANOCHAT_CASES[case]
    base = shutil.copytree(nanochat_base, tmp_path / "nanochat")
    breaker(base / "base_checkpoints" / "d2")
    code, err = (run if in_subprocess else run_here)(
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


HF_CASES = {  # name: (break the model dir copy, subcommand, words the error line must contain); in this process
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
def test_bad_model_dir(case, hf_dir, tmp_path, run_here):
    breaker, command, words = HF_CASES[case]
    model = shutil.copytree(hf_dir, tmp_path / "model")
    breaker(model)
    out = tmp_path / "base_checkpoints" / "out"  # nanochat's layout (to-nanochat puts the tokenizer beside it)
    code, err = run_here(tmp_path, command, "--model", model, "--output", out)
    assert code == 2 and len(err) == 1 and err[0].startswith("convert: error: "), err
    assert all(w in err[0] for w in words), err
    assert not out.exists() and not (tmp_path / "tokenizer").exists()


@pytest.mark.parametrize(
    "in_subprocess, args, words",
    [
        (IN, ["to-nanochat", "--model", "m", "--output", "o", "--step", "-1"], ["--step", "'-1'", "non-negative"]),
        (
            IN,
            ["from-nanochat", "--checkpoint-dir", "c", "--output", "o", "--overwrite", "--dtype", "int8"],
            ["--dtype"],
        ),
        (IN, ["to-native", "--model", "m"], ["--output", "required"]),
        (SUB, ["to-gguf"], ["invalid choice: 'to-gguf'"]),
    ],
)
def test_bad_command_line_is_one_line(tmp_path, in_subprocess, args, words, run_here, capsys):
    if in_subprocess:
        code, err = run(tmp_path, *args)
    else:
        with pytest.raises(SystemExit) as exit_info:  # argparse exits
            run_here(tmp_path, *args)
        code, err = exit_info.value.code, capsys.readouterr().err.strip().splitlines()
    # argparse names the subcommand's parser "convert <subcommand>"
    assert code == 2 and len(err) == 1 and err[0].startswith("convert") and ": error: " in err[0], err
    assert all(w in err[0] for w in words), err


def test_a_missing_source_is_one_line(tmp_path, run_here):
    code, err = run_here(tmp_path, "to-native", "--model", tmp_path / "nowhere", "--output", tmp_path / "out")
    assert code == 2 and err == [f"convert: error: {tmp_path / 'nowhere'}: model directory not found"], err


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path, load_script):
    """Only bad input is turned into one line: an error of ours (here a RuntimeError) reaches the user whole."""
    import nanochat_hf.conversion

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(nanochat_hf.conversion, "to_native", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        load_script("convert").main(["to-native", "--model", str(tmp_path), "--output", str(tmp_path / "out")])
