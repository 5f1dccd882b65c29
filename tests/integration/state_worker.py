"""Spawned gloo workers for test_optimizer_state.py: for every case (architecture x recipe), ``train`` steps a tiny
model with per-rank fixed gradients and writes each rank's optimizer file, plus (rank 0) the state gathered by the
test-only `consolidated_state_dict` (collectives, not our files); ``reload`` reads such a checkpoint at this world
size and writes it again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
import optim_helpers as helpers  # noqa: E402

from nanochat_hf.integration.optimizer_state import (  # noqa: E402
    OPTIMIZER_FILE,
    full_state,
    load_optimizer_state,
    save_optimizer_state,
)
from nanochat_hf.optim import build_optimizer  # noqa: E402

# Conv1D stacks (gpt2, stepped transposed) and 3-D expert stacks as AdamW rows (qwen2_moe)
CASES = [(arch, recipe) for arch in ("gpt2", "qwen2_moe") for recipe in ("2025-12", "2026-07")]


def build(arch: str, recipe: str, sharded: bool | None = None):
    model = helpers.tiny_hf(arch)
    roles = helpers.MOE_ROLES if arch == "qwen2_moe" else None
    return model, build_optimizer(model, recipe=recipe, roles=roles, polar_dtype="float32", sharded=sharded)


def worker(rank: int, world: int, port: int, mode: str, source: str, target: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for arch, recipe in CASES:
            case = f"{arch}-{recipe}"
            out = Path(target) / case
            out.mkdir(parents=True, exist_ok=True)
            model, opt = build(arch, recipe)
            if mode == "train":
                helpers.step_fixed(model, opt, helpers.fixed_grads(model, 3, rank))
                gathered = helpers.consolidated_state_dict(opt)
                if rank == 0:
                    single_model, single = build(arch, recipe, sharded=False)
                    single.load_state_dict(gathered)
                    torch.save(full_state(single, single_model), out / "consolidated.pt")
            else:
                load_optimizer_state(opt, model, Path(source) / case)
            save_optimizer_state(opt, model, out / OPTIMIZER_FILE.format(rank=rank))
    finally:
        dist.destroy_process_group()
