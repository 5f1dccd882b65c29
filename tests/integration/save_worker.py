"""Spawned gloo workers for test_fsdp2_save.py: a tiny nanochat GPT sharded by FSDP2 (`fully_shard` per block and
at the root, as under torchrun on CPU, where Accelerate enables no FSDP) in a Trainer with the mixin; every rank
calls `save_model` (a checkpoint's save path too). Rank 0 also writes the weights before sharding. Then a tiny
Qwen2-MoE, sharded the same way, is saved (save_pretrained writes its fused experts one by one) and read back into
the shards of another one by the resume's loader, from a folder that rank 1 cannot see (the main process alone
reads): rank 0 writes both models' whole weights, and each rank the line with which that loader refuses the GPT's
folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard
from transformers import Trainer, TrainingArguments

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.errors import UserError
from nanochat_hf.integration import NanoChatOptimizerMixin
from nanochat_hf.integration.saving import whole_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
import optim_helpers as helpers  # noqa: E402

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
        moe, other = (_sharded_moe(seed) for seed in (0, 1))
        # rank 1's folder never exists, as on another machine's disk, or before the main process has written it
        # (rank 1 is through the gathering first: its loader found no checkpoint there in one CI run in many)
        folder = str(Path(out) / ("moe" if rank == 0 else "rank1_disk/moe"))
        NanoTrainer(model=moe, args=args).save_model(folder)
        NanoTrainer(model=other, args=args)._load_from_checkpoint(folder)
        saved, loaded = whole_state_dict(moe), whole_state_dict(other)
        if rank == 0:
            save_file(saved, str(Path(out) / "moe_saved.safetensors"))
            save_file(loaded, str(Path(out) / "moe_loaded.safetensors"))
        try:
            NanoTrainer(model=other, args=args)._load_from_checkpoint(str(Path(out) / "model"))
        except UserError as e:
            (Path(out) / f"refused.rank{rank}.txt").write_text(str(e))
    finally:
        dist.destroy_process_group()


def _sharded_moe(seed: int) -> torch.nn.Module:
    model = helpers.tiny_hf("qwen2_moe", seed=seed)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model
