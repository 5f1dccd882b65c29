"""Package exports imported on first use (PEP 562): `from nanochat_hf.data import X` works as before, but importing
a package does not import every module in it. The light parts (the error contract, the task registry) are read by
every command's --help, which must not wait for torch or transformers."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, whose public names live in the submodules `where` maps them to."""

    def getattr_(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *where})

    return getattr_, dir_
