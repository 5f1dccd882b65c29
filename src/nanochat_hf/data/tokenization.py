"""Conversations -> token ids with `datasets.map` (batched, optional multi-process, cached by fingerprint)."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
from datasets import Dataset, Features, Sequence, Value

from .. import tokenizer as tokenizer_package
from ..paths import cache_key
from .conversation import loads

TOKENIZED_FEATURES = Features(
    {
        "input_ids": Sequence(Value("int32")),
        "labels": Sequence(Value("int32")),
        "num_tokens": Value("int32"),
        "task": Value("string"),
    }
)


def _tokenize_batch(batch: dict, tokenizer, max_tokens: int, assistant_only: bool) -> dict:
    conversations = [loads(c) for c in batch["conversation"]]
    ids, masks = tokenizer_package.render_conversations(tokenizer, conversations, max_tokens=max_tokens)
    if assistant_only:
        labels = [[t if m else -100 for t, m in zip(row, mask)] for row, mask in zip(ids, masks)]
    else:  # nanochat mid-training: every token is a target
        labels = ids
    return {"input_ids": ids, "labels": labels, "num_tokens": [len(r) for r in ids], "task": batch["task"]}


def _fingerprint(ds: Dataset, tokenizer, max_tokens: int, assistant_only: bool) -> str:
    """Depends on the data, the tokenizer's content, the options and the rendering code, nothing else."""
    return cache_key(
        ds._fingerprint,
        tokenizer.backend_tokenizer.to_str(),
        repr(max_tokens),
        repr(assistant_only),
        tokenizer_package,
        _tokenize_batch,
    )


def default_cache_dir() -> Path:
    return Path(datasets.config.HF_DATASETS_CACHE) / "nanochat_hf"


def tokenize_conversations(
    ds: Dataset,
    tokenizer,
    max_tokens: int = 2048,
    assistant_only: bool = False,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Dataset:
    """Render every conversation of a mixture (``load_mixture``) to columns input_ids, labels, num_tokens, task.

    labels == input_ids (nanochat mid-training trains on every token), or -100 where the renderer's mask is 0
    with ``assistant_only``. The result is cached in an Arrow file named by a fingerprint of the data, the
    tokenizer and the options (next to the source data, or in ``cache_dir`` / the datasets cache for
    in-memory data), so a second call with the same inputs reads it instead of tokenizing again.
    """
    fingerprint = _fingerprint(ds, tokenizer, max_tokens, assistant_only)
    cache_file = None
    if cache_dir is not None or not ds.cache_files:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        cache_file = str(folder / f"tokenized-{fingerprint}.arrow")
    return ds.map(
        _tokenize_batch,
        batched=True,
        batch_size=500,
        fn_kwargs={"tokenizer": tokenizer, "max_tokens": max_tokens, "assistant_only": assistant_only},
        remove_columns=ds.column_names,
        features=TOKENIZED_FEATURES,
        num_proc=num_proc,
        new_fingerprint=fingerprint,
        cache_file_name=cache_file,
        desc="Tokenizing conversations",
    )
