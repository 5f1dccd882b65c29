"""The first seconds of every command: `import nanochat_hf` is light, and --help, --version and argument errors of
every script answer before torch or transformers are imported (benchmarks/startup.py times them); the package's
names and the Auto classes' lookup work as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = (
    "mid_train",
    "base_train",
    "chat_rl",
    "convert",
    "chat",
    "chat_eval",
    "preview_data",
    "serve",
    "tok_train",
    "tok_eval",
    "base_eval",
    "speedrun",
)

# runs a script as `python script ...` would, then reports whether the heavy libraries were imported
RUN_SCRIPT = """
import runpy, sys
script, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    print("imported:", sorted(m for m in ("torch", "transformers", "datasets") if m in sys.modules), file=sys.stderr)
"""


def run(code: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RANK": "0"}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_version_and_argument_errors_import_neither_torch_nor_transformers(script):
    path = str(ROOT / "scripts" / f"{script}.py")
    help_, version, error = (run(RUN_SCRIPT, path, *a) for a in (["--help"], ["--version"], ["--no-such-flag"]))
    assert help_.returncode == 0 and help_.stdout.startswith("usage: "), help_.stderr
    assert version.returncode == 0 and version.stdout.split() == [script, "0.1.0"], version.stderr
    assert error.returncode == 2 and error.stderr.splitlines()[-2].startswith(f"{script}: error: "), error.stderr
    for proc in (help_, version, error):
        assert proc.stderr.splitlines()[-1] == "imported: []", proc.stderr


@pytest.mark.slow
def test_the_package_imports_light_and_keeps_its_names_and_auto_classes(tmp_path):
    """Slow: what is tested is a fresh interpreter's imports (the package without torch), and then its Auto classes
    loading the model, which imports torch and transformers (seconds)."""
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM  # the names, imported on first use

    config = NanoChatGPTConfig(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)
    NanoChatGPTForCausalLM(config).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert sorted(auto_map) == ["AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"]
    # a fresh process: the package imports without torch and transformers, then the Auto classes find the model
    # (registered when transformers loads them) without remote code
    code = f"""
import sys
import nanochat_hf
assert not {{"torch", "transformers"}} & set(sys.modules), "import nanochat_hf pulled in torch / transformers"
from transformers import AutoModelForCausalLM
print(type(AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})).__name__)
"""
    loaded = run(code)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "NanoChatGPTForCausalLM", loaded.stderr
