"""--push_to_hub against a local hub server, then AutoModelForCausalLM.from_pretrained(repo_id) in a fresh process."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SECRET = "hf_localtestsecret0123456789abcdef"

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


def test_push_to_hub_round_trip(hub_server, tmp_path, tiny_args, run_mid_train):
    endpoint, state = hub_server
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_TOKEN": SECRET,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_XET": "1",
    }
    out = tmp_path / "out"
    proc = run_mid_train(
        [
            *tiny_args,
            "--num_iterations",
            "2",
            "--output_dir",
            str(out),
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "alice/tiny-mid",
        ],
        tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = state.repos["alice/tiny-mid"]
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
    assert b"alice/tiny-mid" in files["README.md"]
    # the token authenticated the requests but appears nowhere in the output or the written files
    assert state.auth_headers and all(h == f"Bearer {SECRET}" for h in state.auth_headers)
    assert SECRET not in proc.stdout + proc.stderr
    assert not any(SECRET.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())

    # a fresh process with an empty cache downloads it by repo id
    fresh = {**env, "HF_HOME": str(tmp_path / "hf2")}
    fresh.pop("HF_TOKEN")
    load = subprocess.run(
        [sys.executable, "-c", LOAD, "alice/tiny-mid"],
        cwd=tmp_path,
        env=fresh,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    assert "LOADED NanoChatGPTForCausalLM" in load.stdout


def test_checkpoint_pushes_carry_no_pickle(hub_server, tmp_path, tiny_args, run_mid_train):
    """--push_to_hub with --save_steps: each save pushes the model files (and with hub_strategy checkpoint the
    checkpoint folder), never training_args.bin; nothing of the kind is written locally either."""
    endpoint, state = hub_server
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_TOKEN": SECRET,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_XET": "1",
    }
    out = tmp_path / "out"
    proc = run_mid_train(
        [
            *tiny_args,
            "--num_iterations",
            "2",
            "--save_steps",
            "1",
            "--output_dir",
            str(out),
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "alice/ckpt-mid",
            "--hub_strategy",
            "checkpoint",
        ],
        tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = state.repos["alice/ckpt-mid"]
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
