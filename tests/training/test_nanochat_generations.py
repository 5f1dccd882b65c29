"""--model_source <nanochat G5 base dir>: the December recipe trains nanochat's current model (G5, a825e63 = HEAD's
model) loaded straight from nanochat's files, resumes, runs on 2 processes with the sharded step equal to 1 process,
pushes to a (local) hub and reloads there with AutoModelForCausalLM."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from mp_launch import MP_ARGS, launch_mid_train  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RUN = [*MP_ARGS, "--num_iterations", "4", "--save_steps", "2", "--eval_every", "2", "--trust_pickle", "true"]
SECRET = "hf_localtestsecret0123456789abcdef"


def write_g5_base(base: Path) -> None:
    """<base>/base_checkpoints/d2/model_000010.pt + meta (window_pattern "SL") and <base>/tokenizer, as nanochat
    writes them: nanochat's tensor names, bf16 wte and value embeddings, fp32 elsewhere; random trained-like values."""
    from nanochat_hf import NanoChatGPTConfig
    from nanochat_hf.conversion.generations import BY_NAME, nanochat_shapes
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.tokenizer import save_nanochat_tokenizer

    tokenizer = demo_tokenizer()
    model_config = {
        "sequence_len": 512,
        "vocab_size": len(tokenizer),
        "n_layer": 2,
        "n_head": 2,
        "n_kv_head": 1,
        "n_embd": 64,
    }
    config = NanoChatGPTConfig(**model_config, **BY_NAME["G5"].fields, pad_vocab_size_to=64)
    g = torch.Generator().manual_seed(0)
    offsets = {"resid_lambdas": 1.0, "x0_lambdas": 0.1, "smear_lambda": 0.3, "backout_lambda": 0.2}
    state = {}
    for key, shape in nanochat_shapes(config).items():
        t = torch.randn(shape, generator=g)
        embedding = key == "transformer.wte.weight" or key.startswith("value_embeds.")
        state[key] = t.to(torch.bfloat16) if embedding else t * 0.1 + offsets.get(key, 0.0)
    ckpt = base / "base_checkpoints" / "d2"
    ckpt.mkdir(parents=True)
    torch.save(state, ckpt / "model_000010.pt")
    meta = {"step": 10, "model_config": {**model_config, "window_pattern": "SL"}, "user_config": {}}
    (ckpt / "meta_000010.json").write_text(json.dumps(meta, indent=2))
    save_nanochat_tokenizer(tokenizer, base / "tokenizer")


@pytest.fixture(scope="module")
def g5_base(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("g5") / "nanochat"
    write_g5_base(base)
    return base


def _launch(cwd: Path, out: Path, nproc: int, extra=(), env=None):
    return launch_mid_train([*RUN, "--output_dir", str(out), *extra], cwd, nproc, timeout=400, env=env)


def _losses(checkpoint: Path) -> list:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"]) for h in history if "lrm" in h]


@pytest.fixture(scope="module")
def one(g5_base, module_hub_server, tmp_path_factory):
    """(folder it ran in, hub state, the hub's env): one process trained on the G5 base with the global batch of 2
    processes (INTERLEAVE), pushing to the local hub as it goes: the run both tests below check."""
    endpoint, state = module_hub_server
    tmp = tmp_path_factory.mktemp("g5run")
    env = {
        "INTERLEAVE": "1",
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_TOKEN": SECRET,
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_DISABLE_XET": "1",
    }
    push = ["--push_to_hub", "true", "--hub_model_id", "alice/g5-mid"]
    _launch(tmp, tmp / "one", 1, ["--model_source", str(g5_base), *push], env=env)
    return tmp, state, env


def test_g5_trains_resumes_and_shards(g5_base, one):
    tmp_path = one[0]
    source = ["--model_source", str(g5_base)]
    one = tmp_path / "one"
    trained = load_file(str(one / "model.safetensors"))
    config = json.loads((one / "config.json").read_text())
    assert config["smear"] and config["backout"] and config["layer_types"][0] == "sliding_attention"
    assert any("smear" in k for k in trained) and any("value_embeds" in k for k in trained)
    # resumed from its step-2 checkpoint: the same losses and weights
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(one / "checkpoint-2", resumed / "checkpoint-2")
    _launch(tmp_path, resumed, 1, [*source, "--resume_from_checkpoint", "true"], env={"INTERLEAVE": "1"})
    assert _losses(resumed / "checkpoint-4") == _losses(one / "checkpoint-4")
    again = load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(trained[k], again[k]) for k in trained)
    # 2 processes, sharded optimizer step: the parameters of 1 process (as tests/training/test_multiprocess.py)
    two = tmp_path / "two"
    _launch(tmp_path, two, 2, source)
    p0, p1 = load_file(str(two / "params.rank0.safetensors")), load_file(str(two / "params.rank1.safetensors"))
    ref = load_file(str(one / "params.rank0.safetensors"))
    for name in ref:
        assert torch.equal(p0[name], p1[name]), name
        torch.testing.assert_close(p0[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)


LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
print("LOADED", type(model).__name__, model.config.smear, out.shape[1])
"""


def test_g5_pushes_and_reloads(one):
    tmp_path, state, env = one
    assert "model.safetensors" in state.repos["alice/g5-mid"]
    fresh = {**env, "HF_HOME": str(tmp_path / "hf2")}
    fresh.pop("HF_TOKEN")
    load = subprocess.run(
        [sys.executable, "-c", LOAD, "alice/g5-mid"],
        cwd=tmp_path,
        env=fresh,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    assert "LOADED NanoChatGPTForCausalLM True 6" in load.stdout
