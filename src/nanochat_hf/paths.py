"""Where files live (nanochat's base directory, our cache) and how a cached file is named."""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def nanochat_base_dir() -> Path:
    """nanochat's base directory (checkpoints, tokenizer, identity file): $NANOCHAT_BASE_DIR, else ~/.cache/nanochat."""
    return Path(os.environ.get("NANOCHAT_BASE_DIR") or Path.home() / ".cache" / "nanochat")


def cache_root() -> Path:
    """Our cache (the demo tokenizer): $NANOCHAT_HF_CACHE, else $HF_HOME/nanochat_hf, else ~/.cache/nanochat_hf."""
    if os.environ.get("NANOCHAT_HF_CACHE"):
        return Path(os.environ["NANOCHAT_HF_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "nanochat_hf"
    return Path.home() / ".cache" / "nanochat_hf"


def cache_key(*parts: str | ModuleType | Callable) -> str:
    """The one cache-key scheme: every cached artefact (the demo tokenizer, tokenized datasets, converted hub tasks)
    is named by a hash of all it is computed from: its inputs and options as strings, and the SOURCE CODE of the
    functions and modules (a package: all its .py files) that compute it. Editing that code therefore invalidates
    the cache by itself, with no version number to remember to bump. (datasets' own fingerprint cannot do this: it
    hashes a module-level function by its name, not its code.)"""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            text = part
        elif isinstance(part, ModuleType) and hasattr(part, "__path__"):  # a package
            text = "\0".join(p.read_text(encoding="utf-8") for p in sorted(Path(part.__path__[0]).rglob("*.py")))
        else:
            text = inspect.getsource(part)
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]
