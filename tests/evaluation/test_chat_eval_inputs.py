"""scripts/chat_eval.py on bad input: one line, exit code 2, before the model is evaluated; a hub task that cannot be
loaded offline is skipped in one line and the others run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(load_script):
    return load_script("chat_eval")


@pytest.fixture
def model_dir(tmp_path, tokenizer, random_model):
    random_model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def _data(tmp_path: Path, name: str, content: bytes) -> list[str]:
    (tmp_path / name).write_bytes(content)
    return ["--tasks", "GSM8K", "--data_files", f"GSM8K={tmp_path / name}"]


CASES = {
    "data file not JSON": (
        lambda m, t: _data(t, "g.jsonl", b"question,answer\n1,2\n"),
        "chat_eval: error: --data_files GSM8K: data file {tmp}/g.jsonl line 1 is not JSON",
    ),
    "data file empty": (
        lambda m, t: _data(t, "g.jsonl", b""),
        "chat_eval: error: --data_files GSM8K: data file {tmp}/g.jsonl is empty (expected rows as JSON objects)",
    ),
    "data file binary": (
        lambda m, t: _data(t, "g.jsonl", bytes(range(256)) * 4),
        "chat_eval: error: --data_files GSM8K: data file {tmp}/g.jsonl line 1 is not JSON (not UTF-8)",
    ),
    "parquet not parquet": (
        lambda m, t: _data(t, "g.parquet", b'{"question": "x"}\n'),
        "chat_eval: error: --data_files GSM8K: data file {tmp}/g.parquet is not a parquet file",
    ),
    "truncated model.safetensors": (
        lambda m, t: (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes()[:2000]) and [],
        "chat_eval: error: {tmp}/model/model.safetensors: not a readable safetensors file",
    ),
    "no tokenizer files": (
        lambda m, t: [(m / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")] and [],
        "chat_eval: error: {tmp}/model: no tokenizer in the model folder (tokenizer.json expected",
    ),
    "--json in a missing folder": (
        lambda m, t: ["--json", str(t / "nope" / "r.json")],
        "chat_eval: error: --json {tmp}/nope/r.json: cannot write in {tmp}/nope (No such file",
    ),
    "--report a folder": (
        lambda m, t: ["--report", str(t)],
        "chat_eval: error: --report {tmp} is a directory; expected a file",
    ),
    "unknown task": (lambda m, t: ["--tasks", "ARC-Hard"], "chat_eval: error: unknown chat-eval task 'ARC-Hard'"),
    "no threads": (lambda m, t: ["--num_threads", "0"], "chat_eval: error: --num_threads 0: expected 1 to "),
    "more threads than cores": (
        lambda m, t: ["--num_threads", "10000"],
        "chat_eval: error: --num_threads 10000: expected 1 to ",
    ),
    "no model folder": (
        lambda m, t: ["--model", str(t / "nope")],
        "chat_eval: error: --model {tmp}/nope: no such model directory",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_before_any_work(case, script, model_dir, tmp_path, capsys, monkeypatch):
    make, message = CASES[case]
    extra = make(model_dir, tmp_path)
    evaluated = []
    monkeypatch.setattr("nanochat_hf.evaluation.run_chat_eval", lambda *a, **k: evaluated.append(a) or [])
    assert script.main(["--model", str(model_dir), "--tasks", "SpellingBee", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(message.format(tmp=tmp_path)), err
    assert not evaluated


@pytest.mark.parametrize(
    "args, line",
    [
        (["--batch_size", "0"], "chat_eval: error: --max_problems, --batch_size and --max_new_tokens must be >= 1\n"),
        (["--batch_size", "all"], "chat_eval: error: argument --batch_size: invalid int value: 'all' (see --help)\n"),
    ],
)
def test_bad_arguments_in_a_fresh_process(model_dir, args, line):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chat_eval.py"), "--model", str(model_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 2 and proc.stderr == line, proc.stderr


@pytest.mark.slow
def test_offline_hub_task_is_skipped_and_the_others_run(model_dir, tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_DATASETS_CACHE": str(tmp_path / "empty-cache"),
    }  # nothing cached: the hub task cannot load
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "chat_eval.py"),
            "--model",
            str(model_dir),
            "--tasks",
            "ARC-Easy,SpellingBee",
            "--max_problems",
            "3",
            "--max_new_tokens",
            "4",
            "--num_threads",
            "1",
            "--json",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith(
        "chat eval ARC-Easy skipped: could not load allenai/ai2_arc/ARC-Easy split 'test'"
    ), proc.stderr
    assert [r["task"] for r in json.loads((tmp_path / "r.json").read_text())] == ["SpellingBee"]
    assert "chat eval SpellingBee: 3/3 problems in " in proc.stderr  # the progress line (stderr is not a terminal)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: a connection there is refused at once


@pytest.mark.slow
@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE=1", "hub unreachable"])
def test_offline_with_nothing_cached_is_one_line_at_once(model_dir, tmp_path, offline):
    """The README's example where no row is cached: HF_HUB_OFFLINE set, or no network (here a hub that refuses
    connections; each load would retry for a minute): one line naming the datasets and what to do, exit 2, before
    the model is loaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"))
    env["CUDA_VISIBLE_DEVICES"] = ""
    if offline == "HF_HUB_OFFLINE=1":
        env["HF_HUB_OFFLINE"], why = "1", "HF_HUB_OFFLINE=1 is set"
    else:
        env["HF_ENDPOINT"] = endpoint = f"http://127.0.0.1:{_closed_port()}"
        why = f"the hub ({endpoint}) cannot be reached"
    args = ["--model", str(model_dir), "--tasks", "ARC-Easy,GSM8K", "--max_problems", "100"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chat_eval.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"chat_eval: error: ARC-Easy (allenai/ai2_arc), GSM8K (openai/gsm8k): not in the datasets cache, and {why}: "
        "run it once where the hub is reachable (without HF_HUB_OFFLINE; the rows are then cached for offline runs), "
        "or give local copies with --data_files TASK=FILE"
    ], proc.stderr[-3000:]
