"""Checkpoint pieces in safetensors + JSON (no pickles): optimizer shards, RNG states, small JSON files."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..atomic import current_umask, replacing, write_text


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write, mode 0666 & ~umask."""
    write_text(path, json.dumps(obj, indent=2))


def usual_modes(directory: str | Path) -> None:
    """Give every file under `directory` the mode a plain open() would (0666 & ~umask), folders 0777 & ~umask.

    safetensors' `save_file` (model weights, optimizer shards, RNG states) creates 0600 files, which a group
    sharing the run could not read.
    """
    mask = current_umask()
    for path in Path(directory).rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def _encode(obj: Any) -> Any:
    """JSON-encode python values, keeping tuples distinguishable from lists."""
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(x) for x in obj]}
    if isinstance(obj, list):
        return [_encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    return obj


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(_decode(x) for x in obj["__tuple__"])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(x) for x in obj]
    return obj


def save_optimizer_state(state_dict: dict, path: str | Path) -> None:
    """torch optimizer state_dict -> one safetensors file (state tensors) with everything else as JSON metadata."""
    tensors, scalars = {}, {}
    for pid, pstate in state_dict["state"].items():
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"{pid}/{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{pid}/{key}"] = value
    rest = {k: v for k, v in state_dict.items() if k != "state"}  # param_groups, plus e.g. the sharding layout
    meta = {"rest": json.dumps(_encode(rest)), "scalars": json.dumps(_encode(scalars))}
    with replacing(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_optimizer_state(path: str | Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    state: dict[int, dict] = {}
    for name, value in list(tensors.items()) + list(_decode(json.loads(meta["scalars"])).items()):
        pid, key = name.split("/", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, **_decode(json.loads(meta["rest"]))}


def save_rng_state(directory: str | Path, rank: int) -> None:
    directory = Path(directory)
    tensors = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.random.get_rng_state_all()):
            tensors[f"cuda{i}"] = s
    save_file(tensors, str(directory / f"rng_state.rank{rank}.safetensors"))
    np_state = np.random.get_state()
    write_json(
        directory / f"rng_state.rank{rank}.json",
        {"python": _encode(random.getstate()), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]},
    )


def load_rng_state(directory: str | Path, rank: int) -> bool:
    directory = Path(directory)
    path = directory / f"rng_state.rank{rank}.safetensors"
    if not path.is_file():
        return False
    tensors = load_file(str(path))
    torch.random.set_rng_state(tensors["cpu"])
    if torch.cuda.is_available() and "cuda0" in tensors:
        torch.cuda.random.set_rng_state_all([tensors[f"cuda{i}"] for i in range(torch.cuda.device_count())])
    other = read_json(directory / f"rng_state.rank{rank}.json")
    random.setstate(_decode(other["python"]))
    kind, keys, *rest = other["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    return True
