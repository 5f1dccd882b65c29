"""nanochat's model generations G1 to G5 (docs: the config's docstring) against logits computed once by nanochat's own
``GPT.forward`` at each generation's commit, stored in data/generations (see the README there: commit, script, seed).

Each file holds a tiny model's weights under nanochat's keys (bf16-exact values), input ids and nanochat's float32
logits for sequences shorter than, as long as and longer than the short attention window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

DATA = Path(__file__).parent / "data" / "generations"
TINY = {"vocab_size": 50, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "pad_vocab_size_to": 64}
SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]  # nanochat's "SSSL" over 3 layers
G1 = dict(TINY, sequence_len=64, residual_lambdas=True)
G2 = dict(G1, layer_types=SLIDING, sliding_window=33)  # nanochat: short window sequence_len // 2 = 32 (+ itself)
G3 = dict(G2, value_embeddings=True, ve_gate_channels=32, ve_gate_scale=2.0)
# G4: short window ceil(256 / 3 / 128) * 128 = 128; nanochat computes its rotary tables in the compute dtype from
# 1076f97 on, float32 in the reference run (bfloat16 before, as for G1 to G3)
G4 = dict(G3, sequence_len=256, sliding_window=129, ve_gate_channels=12, ve_gate_scale=3.0, qk_scale=1.15,
          rope_theta=100000.0, rotary_dtype="float32")
G5 = dict(G4, qk_scale=1.2, smear=True, backout=True)  # short window ceil(256 / 4 / 128) * 128 = 128
GENERATIONS = {"g1": G1, "g2": G2, "g3": G3, "g4": G4, "g5": G5}


def from_nanochat_key(key: str) -> str:
    """nanochat's GPT keeps its scalars, smear gate and value embeddings at the top; ours sit in the backbone."""
    return key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"


def load_reference(gen: str) -> tuple[NanoChatGPTForCausalLM, dict, dict]:
    with safe_open(DATA / f"{gen}.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        meta = f.metadata()
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**GENERATIONS[gen])).eval()
    state = {from_nanochat_key(k.removeprefix("weight.")): v.float() for k, v in tensors.items()
             if k.startswith("weight.")}
    model.load_state_dict(state, strict=True)
    cases = {int(k.split(".")[1]): (tensors[k], tensors[f"logits.{k.split('.')[1]}"]) for k in tensors
             if k.startswith("ids.")}
    return model, cases, meta


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("gen", list(GENERATIONS))
def test_logits_equal_nanochat_at_each_generation(gen, attn):
    model, cases, meta = load_reference(gen)
    model.set_attn_implementation(attn)
    windows = json.loads(meta["window_sizes"])
    if windows is not None:  # nanochat's per-layer FlashAttention windows (w, 0): w + 1 keys
        c = model.config
        assert [w + 1 for w, _ in windows] == [c.sliding_window if t == "sliding_attention" else c.sequence_len + 1
                                               for t in c.layer_types]
        assert min(cases) < c.sliding_window == sorted(cases)[1] < max(cases)  # shorter, equal, longer
    with torch.no_grad():
        for length, (ids, expected) in cases.items():
            logits = model(ids).logits
            assert logits.shape == expected.shape == (1, length, 50)
            assert (logits - expected).abs().max().item() < 1e-5, (gen, attn, length)


def test_each_generation_feature_changes_the_logits():
    """The references would catch a feature left out: switching it off moves the logits far beyond 1e-5."""
    model, cases, _ = load_reference("g5")
    ids, expected = cases[max(cases)]
    changes = [("smear", False), ("backout", False), ("qk_scale", 1.0), ("layer_types", ["full_attention"] * 3),
               ("rope_theta", 10000.0), ("ve_gate_scale", 2.0)]
    for field, value in changes:
        config = NanoChatGPTConfig(**{**G5, field: value})
        other = NanoChatGPTForCausalLM(config).eval()
        other.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            assert (other(ids).logits - expected).abs().max().item() > 1e-3, field
