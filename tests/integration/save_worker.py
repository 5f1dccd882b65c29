"""Spawned gloo workers for test_fsdp2_save.py: a tiny nanochat GPT sharded by FSDP2 (`fully_shard` per block and
at the root, as under torchrun on CPU, where Accelerate enables no FSDP) in a Trainer with the mixin; every rank
calls `save_model` (a checkpoint's save path too). Rank 0 also writes the weights before sharding."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard
from transformers import Trainer, TrainingArguments

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.integration import NanoChatOptimizerMixin

CONFIG = dict(vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=64, sequence_len=32)


class NanoTrainer(NanoChatOptimizerMixin, Trainer):
    pass


def worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**CONFIG))
        if rank == 0:
            save_file(
                {n: p.detach().clone() for n, p in model.named_parameters()}, str(Path(out) / "before.safetensors")
            )
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        assert all(p.to_local().numel() < p.numel() for p in model.transformer.h[0].parameters())  # sharded
        args = TrainingArguments(output_dir=str(Path(out) / "run"), use_cpu=True, report_to=[], disable_tqdm=True)
        NanoTrainer(model=model, args=args).save_model(str(Path(out) / "model"))
    finally:
        dist.destroy_process_group()
