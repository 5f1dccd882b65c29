"""--push_to_hub against a local hub server, then AutoModelForCausalLM.from_pretrained(repo_id) in a fresh process.

The run is conftest.py's `pushed_run` (a fresh mid_train.py process, 4 steps, saved at 2 and 4, hub_strategy
checkpoint), shared with test_run.py: its pushes, output and folder are what each test checks. (Which files each
hub_strategy pushes when is tests/training/test_hub_push.py's, in-process.)"""

import subprocess
import sys

import pytest

from .conftest import HUB_REPO as REPO_ID
from .conftest import HUB_SECRET as SECRET

pytestmark = pytest.mark.slow


LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Spell the word: cat"}], add_generation_prompt=True,
                              return_dict=True, return_tensors="pt")["input_ids"]
out = model.generate(ids, max_new_tokens=5, do_sample=False)
assert out.shape[1] > ids.shape[1]
print("LOADED", type(model).__name__, model.num_parameters())
"""


def test_push_to_hub_round_trip(pushed_run):
    state, proc, out, env, tmp = (getattr(pushed_run, k) for k in ("state", "proc", "out", "env", "tmp"))
    files = state.repos[REPO_ID]
    for name in (
        "model.safetensors",
        "config.json",
        "modeling_nanochat_gpt.py",
        "tokenizer.json",
        "README.md",
        "generation_config.json",
    ):
        assert name in files, sorted(files)
    assert not any(name.startswith("checkpoint-") for name in files)
    assert REPO_ID.encode() in files["README.md"]
    # the token authenticated the requests but appears nowhere in the output or the written files
    assert state.auth_headers and all(h == f"Bearer {SECRET}" for h in state.auth_headers)
    assert SECRET not in proc.stdout + proc.stderr
    assert not any(SECRET.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())

    # a fresh process with an empty cache downloads it by repo id
    fresh = {**env, "HF_HOME": str(tmp / "hf2")}
    fresh.pop("HF_TOKEN")
    load = subprocess.run(
        [sys.executable, "-c", LOAD, REPO_ID],
        cwd=tmp,
        env=fresh,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    assert "LOADED NanoChatGPTForCausalLM" in load.stdout


def test_checkpoint_pushes_carry_no_pickle(pushed_run):
    """--push_to_hub with --save_steps: each save pushes the model files (and with hub_strategy checkpoint the
    checkpoint folder), never training_args.bin; nothing of the kind is written locally either."""
    state, out = pushed_run.state, pushed_run.out
    files = state.repos[REPO_ID]
    assert {
        "model.safetensors",
        "config.json",
        "training_args.json",
        "last-checkpoint/model.safetensors",
        "last-checkpoint/optimizer.rank0.safetensors",
        "last-checkpoint/run_fingerprint.json",
    } <= set(files)
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))], sorted(files)
    assert not [p for p in out.rglob("*") if p.suffix in (".bin", ".pt", ".pkl")]
