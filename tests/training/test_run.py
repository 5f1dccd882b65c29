"""A short `scripts/mid_train.py` run writes a model that a fresh process loads and generates with."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Spell the word: cat"}], add_generation_prompt=True,
                              return_dict=True, return_tensors="pt")["input_ids"]
assert tok.convert_ids_to_tokens(ids[0, -1].item()) == "<|assistant_start|>"
out = model.generate(ids, max_new_tokens=8, do_sample=False)
print("GENERATED", out.shape[1] - ids.shape[1], type(model).__name__)
"""


def test_short_run_writes_loadable_model(tmp_path, tiny_args, run_mid_train):
    out = tmp_path / "out"
    proc = run_mid_train([*tiny_args, "--num_iterations", "4", "--output_dir", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # nanochat's per-step line, the final summary
    assert "step 00004/00004 (100.00%) | loss:" in proc.stdout and "| lrm: " in proc.stdout
    assert "validation bpb:" in proc.stdout and "SimpleSpelling exact match:" in proc.stdout
    assert "sample chat:" in proc.stdout
    for name in ("model.safetensors", "config.json", "modeling_nanochat_gpt.py", "configuration_nanochat_gpt.py",
                 "tokenizer.json", "generation_config.json", "README.md", "report.md", "training_curves.png"):
        assert (out / name).is_file(), name
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_nanochat_gpt.NanoChatGPTForCausalLM"
    card = (out / "README.md").read_text()
    assert "steps: 4" in card and "final validation bits per byte" in card and "from_pretrained" in card
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"

    load = subprocess.run([sys.executable, "-c", LOAD, str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert load.returncode == 0, load.stderr[-3000:]
    assert "GENERATED" in load.stdout and "NanoChatGPTForCausalLM" in load.stdout


def test_dry_run_writes_nothing(tmp_path, tiny_args, capsys):
    from nanochat_hf.training.run import main

    out = tmp_path / "dry"
    metrics = main([*tiny_args, "--num_iterations", "2", "--save_steps", "1", "--dry_run", "true",
                    "--spelling_eval_rows", "0", "--output_dir", str(out)])
    assert metrics["steps"] == 2 and metrics["val_bpb"] > 0
    assert not out.exists() or not any(out.iterdir())
