"""Writing and reading the pieces of a checkpoint in safetensors + JSON (no pickles): RNG states (the optimizer's:
integration/optimizer_state.py); the usual file modes; a full disk during a save as one line. File names: layout.py."""

from __future__ import annotations

import errno
import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ...atomic import current_umask
from ...integration.optimizer_state import json_decode, json_encode
from ...jsonfile import read_json, write_json
from .layout import RNG_STATE_FILE, RNG_TENSORS_FILE


def usual_modes(directory: str | Path) -> None:
    """Give every file under `directory` the mode a plain open() would (0666 & ~umask), folders 0777 & ~umask.

    safetensors' `save_file` (model weights, optimizer shards, RNG states) creates 0600 files, which a group
    sharing the run could not read.
    """
    mask = current_umask()
    for path in Path(directory).rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def save_rng_state(directory: str | Path, rank: int) -> None:
    directory = Path(directory)
    tensors = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.random.get_rng_state_all()):
            tensors[f"cuda{i}"] = s
    save_file(tensors, str(directory / RNG_TENSORS_FILE.format(rank=rank)))
    np_state = np.random.get_state()
    write_json(
        directory / RNG_STATE_FILE.format(rank=rank),
        {"python": json_encode(random.getstate()), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]},
    )


def load_rng_state(directory: str | Path, rank: int) -> None:
    directory = Path(directory)
    tensors = load_file(str(directory / RNG_TENSORS_FILE.format(rank=rank)))
    torch.random.set_rng_state(tensors["cpu"])
    if torch.cuda.is_available() and "cuda0" in tensors:
        torch.cuda.random.set_rng_state_all([tensors[f"cuda{i}"] for i in range(torch.cuda.device_count())])
    other = read_json(directory / RNG_STATE_FILE.format(rank=rank))
    random.setstate(json_decode(other["python"]))
    kind, keys, *rest = other["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))


# ---- a full disk ----------------------------------------------------------------------------------------------------

_FULL = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "a file would exceed the file-size limit (ulimit -f)",
}


class DiskFullError(OSError):
    """A save ran out of space (or hit the file-size limit); str() is one line naming the folder and the space
    needed."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.errno = code  # an outer save (the checkpoint around the model) recognises it and says its own line


def _full_errno(error: BaseException) -> int | None:
    if isinstance(error, OSError) and error.errno in _FULL:
        return error.errno
    text = str(error)  # safetensors' SafetensorError: "Error while serializing: I/O error: ... (os error 28)"
    return next((code for code in _FULL if f"os error {code})" in text or f"code: {code}," in text), None)


def tensor_bytes(*tensor_dicts: dict) -> int:
    """Bytes of the tensors in (nested) state dicts: what a save of them needs on disk, roughly."""

    def walk(obj: Any) -> int:
        if torch.is_tensor(obj):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(walk(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(walk(v) for v in obj)
        return 0

    return sum(walk(d) for d in tensor_dicts)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


@contextmanager
def disk_full_as_one_line(
    what: str, folder: str | Path, needed_bytes: int, undo: Callable[[], None] | None = None
) -> Iterator[None]:
    """Run a save; if it fails for lack of space (ENOSPC, EDQUOT, or EFBIG from a file-size limit, also as
    safetensors' own error), call `undo` (remove what was staged, unless the save's own context did) and raise
    DiskFullError with one line."""
    try:
        yield
    except Exception as e:
        code = _full_errno(e)
        if code is None:
            raise
        if undo is not None:
            undo()
        folder = Path(folder)
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        raise DiskFullError(
            code,
            f"{what} could not be saved in {folder}: {_FULL[code]}; it needs about "
            f"{_mb(needed_bytes)} free there ({_mb(free)} free now); what was staged is removed, "
            "earlier saves are intact",
        ) from None
