"""Point 5 of issue 38: the model a Trainer with the mixin saves under FSDP2 is whole. 2 gloo processes shard a tiny
nanochat GPT with `fully_shard`; `save_model` writes one ordinary folder (no per-rank shards) that
`AutoModelForCausalLM.from_pretrained` loads with the weights as they were before sharding, and that
`convert.py to-nanochat` turns into nanochat's model file. Issue 52: a Qwen2-MoE checkpoint (its fused experts saved one
by one) is read back into another model's FSDP2 shards with the saved weights, bit for bit (the resume refused it);
a folder that is not the model's is refused in the same line on every process (no process left waiting). The main
process alone reads the MoE folder: rank 1 is given one that does not exist (CI once failed "Can't find a valid
checkpoint" on rank 1, through the gathering and loading before rank 0 had written the folder)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nanochat_hf.conversion import to_nanochat

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_fsdp2_model_is_saved_whole(save_worker, tmp_path):
    mp.spawn(save_worker.worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    before = load_file(tmp_path / "before.safetensors")
    folder = tmp_path / "model"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    params = dict(model.named_parameters())
    assert params.keys() == before.keys()
    assert all(torch.equal(params[n].detach(), before[n]) for n in before)
    nanochat = tmp_path / "nanochat" / "base_checkpoints" / "d2"
    to_nanochat(folder, nanochat, step=7)
    state = torch.load(nanochat / "model_000007.pt", weights_only=True)
    assert torch.equal(state["transformer.h.1.mlp.c_fc.weight"].float(), before["transformer.h.1.mlp.c_fc.weight"])
    saved, loaded = (load_file(tmp_path / f"moe_{which}.safetensors") for which in ("saved", "loaded"))
    assert any(".experts.gate_up_proj" in n for n in saved)  # the fused stacks the model holds
    assert not any(".experts.gate_up_proj" in n for n in load_file(tmp_path / "moe" / "model.safetensors"))
    assert saved.keys() == loaded.keys() and all(torch.equal(loaded[n], saved[n]) for n in saved)
    assert not list((tmp_path / "rank1_disk").rglob("*.safetensors"))  # rank 1 loaded it with no weights to see
    refused = [(tmp_path / f"refused.rank{rank}.txt").read_text() for rank in (0, 1)]
    assert refused[0] == refused[1] and "\n" not in refused[0]
    assert "its weights are not Qwen2MoeForCausalLM's (missing ['model." in refused[0]
    assert "other shapes ['lm_head.weight']" in refused[0]
