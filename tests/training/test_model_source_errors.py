"""A damaged local --model_source (corrupt safetensors, bad config.json): one `mid_train: error:` line naming the
file / field, no traceback, exit code 2, nothing written. Run as a user runs it, a subprocess, for one case; the
other cases call mid_train's main() in this process (an exception escaping it fails the test just the same). The
subprocess case is `slow` (a fresh interpreter importing torch and transformers is what it tests: the user's view)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.tokenizer import train_tokenizer
from nanochat_hf.training.run import main

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mid_train.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf")
    tokenizer = train_tokenizer(["spell the word apple", "what is 2 + 2?"] * 5, vocab_size=300)
    config = NanoChatGPTConfig(vocab_size=len(tokenizer), n_layer=1, n_head=1, n_kv_head=1, n_embd=64, sequence_len=64)
    NanoChatGPTForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def set_config(d: Path, **changes) -> None:
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    (d / "config.json").write_text(json.dumps(config))


SUB, IN = True, False
CASES = {  # name: (subprocess?, break the model dir copy, words the error line must contain)
    "corrupt safetensors": (
        SUB,
        lambda d: (d / "model.safetensors").write_bytes(b"\x00garbage" * 8),
        ["model.safetensors", "not a readable safetensors file"],
    ),
    "truncated safetensors": (
        IN,
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:4096]),
        ["model.safetensors", "not a readable safetensors file"],
    ),
    "config.json not JSON": (
        IN,
        lambda d: (d / "config.json").write_text('{"model_type": '),
        ["config.json", "not valid JSON"],
    ),
    "n_layer two": (IN, lambda d: set_config(d, n_layer="two"), ["config.json", "'n_layer'", "'two'"]),
}


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if CASES[case][0] else []) for case in CASES]
)
def test_damaged_model_source_is_one_line(case, model_dir, tmp_path, capsys, monkeypatch):
    in_subprocess, breaker, words = CASES[case]
    source = shutil.copytree(model_dir, tmp_path / "model")
    breaker(source)
    out = tmp_path / "out"
    argv = ["--model_source", str(source), "--output_dir", str(out), "--report_to", "none"]
    if in_subprocess:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300
        )
        code, stderr, stdout = result.returncode, result.stderr, result.stdout
    else:
        monkeypatch.chdir(tmp_path)
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        captured = capsys.readouterr()
        code, stderr, stdout = exit_info.value.code, captured.err, captured.out
    err = stderr.strip().splitlines()
    assert code == 2, stderr[-2000:]
    assert len(err) == 1 and err[0].startswith("mid_train: error: "), err
    assert not stdout.strip(), stdout  # the refusal is the run's one line: no report of what would have run
    assert all(w in err[0] for w in words), err[0]
    assert not out.exists() or not any(out.iterdir())
