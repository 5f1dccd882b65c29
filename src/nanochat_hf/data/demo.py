"""The offline demo's tokenizer: trained by the project's tokenizer trainer on the demo mixture, cached on disk."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

from ..atomic import make_temp_dir
from .conversation import conversation_texts, loads

logger = logging.getLogger("nanochat_hf.data")

DEMO_VOCAB_SIZE = 4096


def cache_root() -> Path:
    """$NANOCHAT_HF_CACHE, else $HF_HOME/nanochat_hf, else ~/.cache/nanochat_hf."""
    if os.environ.get("NANOCHAT_HF_CACHE"):
        return Path(os.environ["NANOCHAT_HF_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "nanochat_hf"
    return Path.home() / ".cache" / "nanochat_hf"


def demo_texts() -> list[str]:
    """Every text of the demo train mixture, in its (deterministic) order."""
    from .mixture import load_mixture

    texts = []
    for conversation in load_mixture(None, split="train")["conversation"]:
        texts.extend(conversation_texts(loads(conversation)))
    return texts


def demo_tokenizer(vocab_size: int = DEMO_VOCAB_SIZE, cache_dir: str | os.PathLike | None = None):
    """A `PreTrainedTokenizerFast` trained with `nanochat_hf.tokenizer.train_tokenizer` on the demo train mixture.

    Deterministic; saved under ``<cache_dir or cache_root()>/demo_tokenizer-<vocab>-<hash of the texts>`` and
    loaded from there on later calls (the folder appears atomically, complete or not at all).
    """
    from transformers import PreTrainedTokenizerFast

    from nanochat_hf.tokenizer import train_tokenizer

    texts = demo_texts()
    # the format tag changes when train_tokenizer's output does (v2: <|bos|> post-processor), so no stale cache is used
    digest = hashlib.sha256("\0".join(["v2", *texts]).encode("utf-8")).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    folder = root / f"demo_tokenizer-{vocab_size}-{digest}"
    if not (folder / "tokenizer.json").is_file():
        logger.info("Training the demo tokenizer (vocab %d) into %s", vocab_size, folder)
        tokenizer = train_tokenizer(texts, vocab_size)
        root.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(root, "demo_tokenizer")  # mode from the umask, not mkdtemp's 0700
        try:
            tokenizer.save_pretrained(tmp)
            try:
                os.replace(tmp, folder)
            except OSError:  # another process finished first: keep its copy
                if not (folder / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(folder)
