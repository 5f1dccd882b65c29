"""Bad input to scripts/preview_data.py (and through it the mixture and task loaders): one line on stderr naming
the file / field / value, no traceback, exit code 2. Run as a user runs it, a subprocess, for one case of each
kind (a bad file, a hub task offline, a bad command line); the other cases call the script's main() in this
process (an exception escaping it fails the test just the same)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import datasets
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "preview_data.py"


@pytest.fixture(scope="module")
def tok_dir(tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(path)
    return path


def run(tmp_path: Path, *args, env: dict | None = None) -> tuple[int, list[str]]:
    environ = {
        **os.environ,
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf_home"),
        "NANOCHAT_HF_CACHE": str(tmp_path / "nanochat_hf"),
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=300,
    )
    return result.returncode, result.stderr.strip().splitlines()


@pytest.fixture
def run_here(load_script, tmp_path, capsys, monkeypatch):
    """run_here(*args, env={}, argparse=False): main(args) in this process, from tmp_path with its own datasets
    cache: exit code (of the SystemExit argparse raises, when `argparse`) and stderr lines."""
    main = load_script("preview_data").main

    def run_in(*args, env: dict | None = None, argparse: bool = False) -> tuple[int, list[str]]:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("NANOCHAT_HF_CACHE", str(tmp_path / "nanochat_hf"))
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        if "HF_DATASETS_OFFLINE" in (env or {}):  # datasets reads it at import
            monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        with pytest.raises(SystemExit) if argparse else nullcontext() as exit_info:
            code = main([str(a) for a in args])
        code = exit_info.value.code if argparse else code
        return code, capsys.readouterr().err.strip().splitlines()

    return run_in


def mixture(tmp_path: Path, *tasks: dict) -> Path:
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"tasks": list(tasks)}))  # JSON is YAML
    return path


def gsm8k_file(tmp_path: Path, name: str, content: bytes) -> dict:
    (tmp_path / name).write_bytes(content)
    return {"task": "gsm8k", "data_files": [name]}


GOOD_ROW = b'{"question": "What is 3 times 4?", "answer": "3*4=<<3*4=12>>12\\n#### 12"}\n'
SUB, IN = True, False
ARGPARSE_CASES = ("text batch size", "negative -n", "bad color", "zero seq len")  # argparse exits (SystemExit) instead
ONE_LINE_CASES = {  # name: (subprocess?, mixture tasks or None, extra args, env, words the line must contain)
    "empty jsonl": (IN, lambda t: [gsm8k_file(t, "rows.jsonl", b"")], [], {}, ["rows.jsonl", "is empty"]),
    "blank jsonl": (IN, lambda t: [gsm8k_file(t, "rows.jsonl", b"\n \n")], [], {}, ["rows.jsonl", "is empty"]),
    "non-JSON jsonl": (
        SUB,
        lambda t: [gsm8k_file(t, "rows.jsonl", b"question,answer\n1,2\n")],
        [],
        {},
        ["rows.jsonl", "line 1 is not JSON"],
    ),
    "binary jsonl": (
        IN,
        lambda t: [gsm8k_file(t, "rows.jsonl", b"\xff\xfe\x00garbage\n")],
        [],
        {},
        ["rows.jsonl", "not JSON"],
    ),
    "empty json": (IN, lambda t: [gsm8k_file(t, "rows.json", b"")], [], {}, ["rows.json", "is empty"]),
    "non-JSON json": (IN, lambda t: [gsm8k_file(t, "rows.json", b"hello")], [], {}, ["rows.json", "not JSON"]),
    "empty parquet": (IN, lambda t: [gsm8k_file(t, "rows.parquet", b"")], [], {}, ["rows.parquet", "not a parquet"]),
    "non-parquet": (
        IN,
        lambda t: [gsm8k_file(t, "rows.parquet", GOOD_ROW)],
        [],
        {},
        ["rows.parquet", "not a parquet"],
    ),
    "empty identity file": (
        IN,
        lambda t: [{"task": "identity", "path": str(t / "id.jsonl")}],
        [],
        {},
        ["id.jsonl", "is empty"],
    ),
    "data_files not a list": (IN, lambda t: [{"task": "gsm8k", "data_files": 3}], [], {}, ["data_files", "3"]),
    "path not a string": (IN, lambda t: [{"task": "identity", "path": 7}], [], {}, ["path must be a string", "7"]),
    "hub task offline": (
        SUB,
        lambda t: [{"task": "gsm8k", "split": "test"}],
        [],
        {"HF_HUB_OFFLINE": "1"},
        ["openai/gsm8k", "offline", "data_files"],
    ),
    "hub task offline (datasets)": (
        IN,
        lambda t: [{"task": "mmlu"}],
        [],
        {"HF_DATASETS_OFFLINE": "1"},
        ["cais/mmlu", "offline", "data_files"],
    ),
    "unknown task": (IN, lambda t: [{"task": "gsm9k"}], [], {}, ["unknown task 'gsm9k'"]),
    "unknown split": (IN, lambda t: None, ["--split", "nope"], {}, ["split 'nope'"]),
    "missing mixture": (IN, lambda t: None, ["--mixture", "nowhere.yaml"], {}, ["nowhere.yaml", "not found"]),
    "zero seq len": (IN, lambda t: None, ["--max-seq-len", "0"], {}, ["--max-seq-len", "positive integer", "'0'"]),
    "text batch size": (IN, lambda t: None, ["--device-batch-size", "big"], {}, ["--device-batch-size", "'big'"]),
    "negative -n": (IN, lambda t: None, ["-n", "-3"], {}, ["-n", "'-3'"]),
    "indivisible batch": (
        IN,
        lambda t: None,
        ["--total-batch-size", "1000", "--max-seq-len", "64"],
        {},
        ["total_batch_size 1000", "8*64*1"],
    ),  # the demo config's 8 rows
    "unknown flag": (SUB, lambda t: None, ["--colour", "never"], {}, ["unrecognized arguments: --colour"]),
    "bad color": (IN, lambda t: None, ["--color", "pink"], {}, ["--color", "'pink'"]),
    "missing tokenizer": (IN, lambda t: None, ["--tokenizer", "no_such_dir"], {}, ["no_such_dir", "no such directory"]),
    "damaged tokenizer": (IN, lambda t: None, ["--tokenizer", "broken_tok"], {}, ["broken_tok", "cannot be loaded"]),
    "pickle not trusted": (
        IN,
        lambda t: None,
        ["--tokenizer", "nanochat_tok"],
        {},
        ["tokenizer.pkl", "--trust-pickle"],
    ),
}


# the fresh-process cases import torch and the datasets stack (seconds): slow
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if v[0] == SUB else c for c, v in ONE_LINE_CASES.items()]
)
def test_bad_input_is_one_line(case, tmp_path, tok_dir, run_here):
    in_subprocess, tasks, extra, env, words = ONE_LINE_CASES[case]
    (tmp_path / "id.jsonl").write_text("")
    (tmp_path / "broken_tok").mkdir()
    (tmp_path / "broken_tok" / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    (tmp_path / "nanochat_tok").mkdir()
    (tmp_path / "nanochat_tok" / "tokenizer.pkl").write_bytes(b"\x80\x04N.")
    spec = tasks(tmp_path)
    args = (["--mixture", mixture(tmp_path, *spec)] if spec else []) + ["--tokenizer", tok_dir] + extra
    if in_subprocess:
        code, err = run(tmp_path, *args, env=env)
    else:
        code, err = run_here(*args, env=env, argparse=case in ARGPARSE_CASES)
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("preview_data: error: ") and all(w in err[0] for w in words), err


def test_malformed_yaml(tmp_path, tok_dir, run_here):
    (tmp_path / "mix.yaml").write_text("tasks:\n  - {task: gsm8k, split: test\n  - oops: [\n")
    code, err = run_here("--mixture", "mix.yaml", "--tokenizer", tok_dir)
    assert code == 2 and len(err) == 1 and err[0].startswith("preview_data: error: "), err
    assert "mix.yaml: not valid YAML" in err[0] and "line " in err[0], err


def test_damage_past_the_first_line_still_ends_in_one_error_line(tmp_path, tok_dir, run_here):
    # the first row is fine, so only datasets' parser finds the damage (it logs its own line before ours)
    mix = mixture(tmp_path, gsm8k_file(tmp_path, "rows.jsonl", GOOD_ROW + b"{oops\n"))
    code, err = run_here("--mixture", mix, "--tokenizer", tok_dir)
    assert code == 2 and not any("Traceback" in line for line in err), err
    assert err[-1].startswith("preview_data: error: ") and "rows.jsonl" in err[-1] and "JSON" in err[-1], err
