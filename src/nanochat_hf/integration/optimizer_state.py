"""The optimizer-state files of a checkpoint, in one place: each rank's shard of nanochat's optimizer as safetensors
(tensors) with everything else as JSON metadata, and the scheduler as JSON. No pickles. The mixin and MidTrainer
write and read them; conversion/ turns them into nanochat's ``optim_<step>_rank<r>.pt``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..atomic import replacing
from ..optim import RECIPES, NorMuonAdamW

OPTIMIZER_FILE = "optimizer.rank{rank}.safetensors"  # this rank's optimizer shard
SCHEDULER_FILE = "scheduler.json"


def json_encode(obj: Any) -> Any:
    """JSON-encode python values, keeping tuples distinguishable from lists."""
    if isinstance(obj, tuple):
        return {"__tuple__": [json_encode(x) for x in obj]}
    if isinstance(obj, list):
        return [json_encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): json_encode(v) for k, v in obj.items()}
    return obj


def json_decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(json_decode(x) for x in obj["__tuple__"])
        return {k: json_decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_decode(x) for x in obj]
    return obj


def recipe_of(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer recipe (optim.RECIPES) an optimizer of build_optimizer runs."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps ours
    return RECIPES[1] if isinstance(optimizer, NorMuonAdamW) else RECIPES[0]


def save_optimizer_state(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """The optimizer's state_dict -> one safetensors file (state tensors) with everything else (and the recipe) as
    JSON metadata."""
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, pstate in state_dict["state"].items():
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"{pid}/{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{pid}/{key}"] = value
    rest = {k: v for k, v in state_dict.items() if k != "state"}  # param_groups, plus e.g. the sharding layout
    meta = {
        "rest": json.dumps(json_encode(rest)),
        "scalars": json.dumps(json_encode(scalars)),
        "recipe": recipe_of(optimizer),
    }
    with replacing(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_optimizer_state(path: str | Path) -> dict:
    """A state_dict written by `save_optimizer_state`, its "recipe" among the entries besides "state"."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    state: dict[int, dict] = {}
    for name, value in list(tensors.items()) + list(json_decode(json.loads(meta["scalars"])).items()):
        pid, key = name.split("/", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, **json_decode(json.loads(meta["rest"])), "recipe": meta["recipe"]}


def checkpoint_shards(directory: Path) -> tuple[str, list[dict[str, Any]]] | None:
    """(recipe, per-rank optimizer states) of a trainer checkpoint folder, or None when it holds no optimizer."""
    paths = []
    while (directory / OPTIMIZER_FILE.format(rank=len(paths))).is_file():
        paths.append(directory / OPTIMIZER_FILE.format(rank=len(paths)))
    if not paths:
        return None
    shards = [load_optimizer_state(p) for p in paths]
    return shards[0]["recipe"], shards
