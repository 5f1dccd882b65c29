"""The December optimizer (recipe 2025-12) on nanochat's later model generations: every G1-G5 parameter in the group
nanochat gave it, and the sharded step on 2 processes equal to 1 process (1-element and per-layer scalars included).
A module with the G5 parameter names and shapes stands in for the model (names under ``transformer.``, ours)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nanochat_hf.optim.routing import SCALAR_LR, build_optimizer

SHAPES = {
    "transformer.resid_lambdas": (3,),
    "transformer.x0_lambdas": (3,),
    "transformer.smear_lambda": (1,),
    "transformer.backout_lambda": (1,),
    "transformer.wte.weight": (11, 64),
    "transformer.h.0.attn.c_q.weight": (64, 64),
    "transformer.h.0.attn.ve_gate.weight": (2, 12),
    "transformer.h.0.mlp.c_fc.weight": (256, 64),
    "transformer.value_embeds.0.weight": (11, 32),
    "transformer.smear_gate.weight": (1, 24),
    "lm_head.weight": (11, 64),
}


def g5_like(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    root = nn.Module()
    root.config = SimpleNamespace(n_embd=64)
    for name, shape in SHAPES.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, nn.Parameter(torch.randn(shape) * 0.1))
    return root


def test_december_groups_of_a_g5_model():
    model = g5_like()
    names = {id(p): n for n, p in model.named_parameters()}
    opt = build_optimizer(model, embedding_lr=0.2, unembedding_lr=0.004, matrix_lr=0.02, init_lr_frac=0.5)
    groups = {g["name"]: g for g in opt.param_groups}
    assert list(groups) == [
        "adamw/lm_head",
        "adamw/wte",
        "adamw/value_embeds",
        "adamw/resid_lambdas",
        "adamw/x0_lambdas",
        "adamw/smear",
        "muon/matrix",
    ]  # nanochat's order (a825e63)
    members = {k: [names[id(p)].removeprefix("transformer.") for p in g["params"]] for k, g in groups.items()}
    assert members["adamw/smear"] == ["smear_lambda", "backout_lambda", "smear_gate.weight"]
    assert members["adamw/value_embeds"] == ["value_embeds.0.weight"]
    assert "h.0.attn.ve_gate.weight" in members["muon/matrix"]  # a matrix in the block: Muon
    scale = (64 / 768) ** -0.5
    expected = {
        "adamw/value_embeds": 0.2 * scale,
        "adamw/resid_lambdas": 0.01 * SCALAR_LR,
        "adamw/x0_lambdas": SCALAR_LR,
        "adamw/smear": 0.2,
    }
    for name, lr in expected.items():  # the December AdamW settings, nanochat's rates, times init_lr_frac
        g = groups[name]
        assert g["lr"] == g["initial_lr"] == pytest.approx(lr * 0.5), name
        assert (g["betas"], g["eps"], g["weight_decay"]) == ((0.8, 0.95), 1e-10, 0.0), name


def test_head_recipe_groups_of_a_g5_model():
    """Recipe 2026-07 on a real G5 model: nanochat HEAD's setup_optimizer groups, although our backbone holds the
    parameters nanochat keeps at the top level (transformer.resid_lambdas, ...)."""
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    config = NanoChatGPTConfig(
        vocab_size=300,
        sequence_len=64,
        n_layer=4,
        n_head=2,
        n_embd=64,
        pad_vocab_size_to=64,
        residual_lambdas=True,
        value_embeddings=True,
        ve_gate_channels=12,
        ve_gate_scale=3.0,
        qk_scale=1.2,
        smear=True,
        backout=True,
        rope_theta=1e5,
    )
    model = NanoChatGPTForCausalLM(config)
    names = {id(p): n for n, p in model.named_parameters()}
    opt = build_optimizer(model, recipe="2026-07")
    members = {g["name"]: [names[id(p)] for p in g["params"]] for g in opt.param_groups}
    assert list(members)[:6] == [
        "adamw/lm_head",
        "adamw/wte",
        "adamw/value_embeds",
        "adamw/resid_lambdas",
        "adamw/x0_lambdas",
        "adamw/smear",
    ]  # setup_optimizer's order at 92d63d4
    assert members["adamw/value_embeds"] == ["transformer.value_embeds.1.weight", "transformer.value_embeds.3.weight"]
    assert members["adamw/smear"] == [
        "transformer.smear_gate.weight",
        "transformer.smear_lambda",
        "transformer.backout_lambda",
    ]  # nanochat's module order
    muon = [n for k, ns in members.items() if k.startswith("muon/") for n in ns]
    assert "transformer.h.1.attn.ve_gate.weight" in muon
    assert sorted(n for ns in members.values() for n in ns) == sorted(names.values())  # each parameter once


def sharded_worker(rank, world, port, out):
    """Run in conftest's shared spawn (gloo_runs): 3 sharded steps on per-rank gradients equal, bit for bit, one
    process stepping on their average; rank 0 writes "equal" to ``out``."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    def grads(model, r, step):
        g = torch.Generator().manual_seed(100 * step + r)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)

    try:
        sharded, single = g5_like(), g5_like()
        opt = build_optimizer(sharded)
        ref = build_optimizer(single, sharded=False)
        assert opt.reduces_gradients and not ref.reduces_gradients
        for step in range(3):
            grads(sharded, rank, step)
            opt.step()
            per_rank = []
            for r in range(world):
                grads(single, r, step)
                per_rank.append([p.grad.clone() for p in single.parameters()])
            for p, *gs in zip(single.parameters(), *per_rank):
                p.grad = sum(gs) / world
            ref.step()
        for (name, a), b in zip(sharded.named_parameters(), single.parameters()):
            assert torch.equal(a, b), name
        if rank == 0:
            Path(out).write_text("equal")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_step_equals_one_process(gloo_runs):
    assert (gloo_runs / "g5" / "out").read_text() == "equal"
