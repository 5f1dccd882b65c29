"""A transformers Trainer with NanoChatOptimizerMixin on an FSDP2-sharded tiny Llama, for test_fsdp_trainer.py
(runs_worker.py's "fsdp_trainer" runs: run(out, args)).

    args: train [--fsdp] [--accumulation N]    (`accelerate launch`: 2 gloo processes)
          fsdp1|shard1|hsdp PORT               (one plain process: refused, in one line; a gloo group of one
                                                process on PORT, unless an earlier run of the launch opened one)

train: trainer_worker.py's tiny run (4 steps, global batch 4, in N micro-batches per process), clipping at 0.1 (every
step clips); --fsdp applies
`fully_shard` to each decoder layer and the root before the Trainer is built (Accelerate enables FSDP on GPUs only).
Writes rank 0's whole parameters and, per rank, the logged losses and grad norms and the optimizer's path.
fsdp1 / shard1 / hsdp: the model wrapped by FSDP1, sharded by FSDP2 on dim 1, or by HSDP on a 2-D mesh; writes
the refusal's text (shard1: the optimizer's own refusals too).
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from trainer_worker import NanoTrainer, tiny_run

from nanochat_hf.errors import UserError


def shard(model, **kwargs):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def _optimizer_refusals(sharded, out: Path) -> None:
    """build_optimizer on the sharded model, and an optimizer built on a whole model whose groups then get the
    sharded parameters (what Accelerate's FSDP2 does after sharding): their refusals, in refused_build.txt and
    refused_swap.txt."""
    from nanochat_hf.optim import build_optimizer

    try:
        build_optimizer(sharded)
    except UserError as e:
        (out / "refused_build.txt").write_text(str(e))
    whole, _, _ = tiny_run(out)
    opt = build_optimizer(whole)
    by_id = {id(p): name for name, p in whole.named_parameters()}
    shards = dict(sharded.named_parameters())
    for group in opt.param_groups:
        group["params"] = [shards[by_id[id(p)]] for p in group["params"]]
    try:
        opt.reduces_gradients  # noqa: B018 (adopts the FSDP2 parameters, or refuses them)
    except UserError as e:
        (out / "refused_swap.txt").write_text(str(e))


def run(out: Path, args: list[str]) -> None:
    mode, *flags = args
    accumulation = int(flags[flags.index("--accumulation") + 1]) if "--accumulation" in flags else 1
    model, data, args = tiny_run(out, max_grad_norm=0.1, accumulation=accumulation)
    if mode != "train":
        if not dist.is_initialized():
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=flags[0])
            dist.init_process_group("gloo", rank=0, world_size=1)
        if mode == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
        elif mode == "hsdp":  # replicated across one mesh dimension, sharded across the other
            from torch.distributed.device_mesh import init_device_mesh

            shard(model, mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard")))
        else:
            from torch.distributed.tensor import Shard

            shard(model, shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else Shard(0))
        try:
            NanoTrainer(model=model, args=args, train_dataset=data)
        except UserError as e:
            (out / "refused.txt").write_text(str(e))
        if mode == "shard1":  # the optimizer's own refusals name the parameter too (they named its group)
            _optimizer_refusals(model, out)
        return
    _ = args.device  # initialises torch.distributed under accelerate launch (fully_shard needs it)
    if "--fsdp" in flags:
        shard(model)
    trainer = NanoTrainer(model=model, args=args, train_dataset=data, nanochat_optimizer={"polar_dtype": "float32"})
    trainer.train()
    opt = trainer.optimizer.optimizer
    rank = trainer.accelerator.process_index
    logs = [h for h in trainer.state.log_history if "loss" in h]
    report = {
        "fsdp": opt.fsdp_mesh is not None,
        "world_size": opt.world_size,
        "losses": [h["loss"] for h in logs],
        "grad_norms": [h["grad_norm"] for h in logs],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
    if rank == 0:
        save_file({n: p.contiguous() for n, p in params.items()}, str(out / "params.safetensors"))
