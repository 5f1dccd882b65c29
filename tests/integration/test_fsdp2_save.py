"""Point 5 of issue 38: the model a Trainer with the mixin saves under FSDP2 is whole. 2 gloo processes shard a tiny
nanochat GPT with `fully_shard`; `save_model` writes one ordinary folder (no per-rank shards) that
`AutoModelForCausalLM.from_pretrained` loads with the weights as they were before sharding, and that
`convert.py to-nanochat` turns into nanochat's model file."""

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
