"""The offline demo's tokenizer: trained by the project's tokenizer trainer on the demo mixture, cached on disk."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from .. import tokenizer as tokenizer_package
from ..atomic import staged_dir
from ..paths import cache_key, cache_root
from .conversation import conversation_texts, loads
from .mixture import load_mixture

logger = logging.getLogger("nanochat_hf.data")

DEMO_VOCAB_SIZE = 4096
DEMO_SEQUENCE_LEN = 1024  # the demo model's context (longer when max_seq_len asks for more): the tokenizer's max length


def demo_texts() -> list[str]:
    """Every text of the demo train mixture, in its (deterministic) order."""
    return list(_demo_texts())


@functools.cache  # a process asks twice or more (the tokenizer's cache key, a run's setup): built once, seconds
def _demo_texts() -> tuple[str, ...]:
    texts = []
    # the column read whole: iterating a Dataset's column goes through datasets' row formatter (10x slower)
    for conversation in load_mixture(None, split="train").select_columns("conversation")[:]["conversation"]:
        texts.extend(conversation_texts(loads(conversation)))
    return tuple(texts)


def demo_tokenizer(vocab_size: int = DEMO_VOCAB_SIZE, cache_dir: str | os.PathLike | None = None):
    """A `PreTrainedTokenizerFast` trained with `nanochat_hf.tokenizer.train_tokenizer` on the demo train mixture.

    Its ``model_max_length`` is the demo model's ``DEMO_SEQUENCE_LEN`` (transformers' default is "no limit", 1e30).
    Deterministic; saved under ``<cache_dir or cache_root()>/demo_tokenizer-<vocab>-<cache key>`` (the key covers
    the texts and the tokenizer package's code) and loaded from there on later calls (the folder appears
    atomically, complete or not at all).
    """
    texts = demo_texts()
    digest = cache_key(*texts, tokenizer_package)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    folder = root / f"demo_tokenizer-{vocab_size}-{digest}"
    if not (folder / "tokenizer.json").is_file():
        logger.info("Training the demo tokenizer (vocab %d) into %s", vocab_size, folder)
        tokenizer = tokenizer_package.train_tokenizer(texts, vocab_size)
        try:
            with staged_dir(folder) as tmp:
                tokenizer.save_pretrained(tmp)
        except OSError:  # another process finished first (FileExistsError when its files differ): keep its copy
            if not (folder / "tokenizer.json").is_file():
                raise
    return PreTrainedTokenizerFast.from_pretrained(folder, model_max_length=DEMO_SEQUENCE_LEN)
