"""The model a Trainer saves is whole, also when FSDP2 (`fully_shard`) shards its parameters across processes: one
ordinary Hugging Face folder that `from_pretrained` and `convert.py to-nanochat` read."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule


def whole_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full state dict of a model FSDP2 shards, gathered (torch's full-state-dict gathering) into the main
    process's CPU memory, the other processes getting {}: a collective, every process must call it. None for a
    model FSDP2 does not shard (its own state_dict is whole)."""
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        return None
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
