"""The model a Trainer saves is whole, also when FSDP2 (`fully_shard`) shards its parameters across processes: one
ordinary Hugging Face folder that `from_pretrained` and `convert.py to-nanochat` read; and a checkpoint's whole
weights load back into the shards (the stock resume copies plain tensors into DTensors, which DTensor refuses); a
whole copy to generate with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import FSDPModule
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..errors import UserError
from ..jsonfile import read_json


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 (`fully_shard`) shards any of the model's modules."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors weight files of a saved model folder (one file, or an index's shards); [] for none."""
    if (folder / SAFE_WEIGHTS_NAME).is_file():
        return [folder / SAFE_WEIGHTS_NAME]
    if (folder / SAFE_WEIGHTS_INDEX_NAME).is_file():
        return [folder / f for f in sorted(set(read_json(folder / SAFE_WEIGHTS_INDEX_NAME)["weight_map"].values()))]
    return []


def whole_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full state dict of a model FSDP2 shards, gathered (torch's full-state-dict gathering) into the main
    process's CPU memory, the other processes getting {}: a collective, every process must call it. None for a
    model FSDP2 does not shard (its own state_dict is whole)."""
    if not is_sharded(model):
        return None
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_whole_state_dict(model: torch.nn.Module, read: Callable[[], dict[str, torch.Tensor] | None]) -> bool:
    """`whole_state_dict`'s counterpart for a model FSDP2 shards (a collective): the main process reads the whole
    weights (`read`; its `UserError`, a checkpoint refused, is raised on every process; its None, nothing of the
    kind to read, is False on every process, nothing loaded) and torch's full-state-dict loading sends every process
    its rows. Not strict: `read` checks the names (a tied weight saved once is absent). The other processes never
    look at what `read` reads: they follow the main process's outcome."""
    state, outcome = {}, [(True, None)]  # (loaded, the refusal)
    if dist.get_rank() == 0:  # the others receive their rows by broadcast: one whole copy in memory, not W
        try:
            state = read()
            outcome = [(state is not None, None)]
        except UserError as e:
            outcome = [(False, str(e))]
    dist.broadcast_object_list(outcome, src=0)
    loaded, refused = outcome[0]
    if refused is not None:
        raise UserError(refused)
    if loaded:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        set_model_state_dict(model, state, options=options)
    return loaded


def own_class(model: torch.nn.Module) -> type:
    """The model's class before `fully_shard` made it an instance of an FSDP<Name> subclass."""
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def whole_copy(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module | None:
    """A whole, unsharded copy of a model FSDP2 shards, on every process (a collective: every process calls it), on
    ``device``; None for a model FSDP2 does not shard. A forward without backward (validation) leaves FSDP2's root
    parameters gathered as plain tensors: every module is resharded first, so the gathering sees DTensors only."""
    if not is_sharded(model):
        return None
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    whole = own_class(model)(model.config)
    whole.load_state_dict(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    whole.generation_config = model.generation_config
    return whole.to(device)


@contextmanager
def unsharded_class(model: torch.nn.Module) -> Iterator[None]:
    """While saving, ``model`` has its own class again: `fully_shard` makes it an instance of a subclass made on the
    fly (FSDP<Name>, defined in torch's _fsdp_init.py), which save_pretrained of a remote-code model would write
    into the folder (config auto_map "_fsdp_init.FSDP<Name>", torch's _fsdp_*.py files copied beside it), so that
    from_pretrained(trust_remote_code=True) of the folder fails. Nothing else changes: no forward runs meanwhile."""
    sharded = type(model)
    if not issubclass(sharded, FSDPModule):
        yield
        return
    model.__class__ = own_class(model)
    try:
        yield
    finally:
        model.__class__ = sharded
