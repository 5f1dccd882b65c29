"""nanochat's tok_train.py: the text it reads, its BPE training, and the tokenizer folder it writes.

The text is HEAD's (scripts/tok_train.py over nanochat/dataset.py's `parquets_iter_batched(split="train")`): every
shard of the data folder but the last (the validation shard), in file-name order, each document in row order, cut
to `doc_cap` characters, until the total passes `max_chars` (the document that passes it is kept). The shards are
listed and read by the pretraining data's `data/pretraining.py` (through `datasets`, streaming: nothing is copied
into a cache).

The trainer is rustbpe, the library HEAD's tok_train.py trains with. The Hugging Face `tokenizers` BpeTrainer
(`tokenizer.train_tokenizer`, the demo tokenizer) learns the same merges until two pairs are equally frequent, then
breaks the tie differently: it ranks the 256 byte tokens by their printable stand-in characters, rustbpe by byte
value (on the tokenizer tests' corpus they part at the 38th of 759 merges). HEAD's merges, exactly, come only from
rustbpe; its result is turned into the fast tokenizer (`tokenizer_from_tiktoken`), which encodes as tiktoken does.
docs/tokenizer.md has the comparison and the timing.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from ..atomic import staged_dir
from ..data.pretraining import document_batches, list_shards, split_shards
from ..errors import UserError
from ..paths import nanochat_base_dir
from ..progress import Progress
from .chat_format import SPECIAL_TOKENS
from .nanochat_format import nanochat_tokenizer_files, tokenizer_from_tiktoken
from .tokenizer import SPLIT_PATTERN, TOKEN_BYTES_KEY

# HEAD's tok_train.py defaults
MAX_CHARS = 2_000_000_000
DOC_CAP = 10_000
VOCAB_SIZE = 32768
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte, then the special tokens
# the files of a tokenizer folder: ours (Hugging Face) and HEAD's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.pkl", "token_bytes.pt")


def default_output_dir() -> Path:
    return nanochat_base_dir() / "tokenizer"


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(
            f"--vocab_size {vocab_size} is too small: at least {MIN_VOCAB_SIZE} (256 byte tokens + "
            f"{len(SPECIAL_TOKENS)} special tokens)"
        )


def shard_documents(shards: list[str]) -> Iterator[str]:
    """Every document of `shards`, file after file, row group after row group, in row order: one pass of the
    pretraining reader (`document_batches`, through `datasets`), which is HEAD's `parquets_iter_batched` order."""
    for documents, (_, _, epoch) in document_batches(shards):
        if epoch > 1:
            return
        yield from documents


def capped_documents(documents: Iterable[str], max_chars: int, doc_cap: int) -> Iterator[str]:
    """HEAD's text_iterator: each document cut to `doc_cap` characters; it stops after the document that takes the
    total past `max_chars`."""
    nchars = 0
    for doc in documents:
        doc = doc[:doc_cap]
        nchars += len(doc)
        yield doc
        if nchars > max_chars:
            return


def train_bpe(texts: Iterable[str], vocab_size: int = VOCAB_SIZE, verbose: bool = False) -> PreTrainedTokenizerFast:
    """nanochat's tokenizer trained on `texts` as HEAD's RustBPETokenizer.train_from_iterator does: rustbpe with
    nanochat's split pattern to `vocab_size` - 9 tokens (the 256 bytes, then the merges), then the nine special
    tokens. token_bytes counts raw bytes, as HEAD's tok_train.py writes it.

    Text too short for the vocabulary is refused in one line (HEAD would silently make a smaller one). With
    `verbose`, a line when the text is all read (the merges start) and one when training ends."""
    import rustbpe

    check_vocab_size(vocab_size)
    seen = {"chars": 0, "docs": 0}
    t0 = time.monotonic()

    def counted() -> Iterator[str]:
        for text in texts:
            seen["chars"] += len(text)
            seen["docs"] += 1
            yield text
        if verbose:
            print(
                f"read {seen['chars']:,} characters in {seen['docs']:,} documents ({time.monotonic() - t0:.1f}s); "
                f"computing {vocab_size - MIN_VOCAB_SIZE:,} merges",
                flush=True,
            )

    trainer = rustbpe.Tokenizer()
    with _rustbpe_progress(verbose):
        trainer.train_from_iterator(counted(), vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(k): v for k, v in trainer.get_mergeable_ranks()}
    if seen["chars"] == 0:
        raise UserError(f"no training text: the {seen['docs']} documents read are all empty")
    if len(ranks) < vocab_size - len(SPECIAL_TOKENS):
        raise UserError(
            f"the training text ({seen['chars']:,} characters in {seen['docs']:,} documents) gives only "
            f"{len(ranks) - 256} merges, and --vocab_size {vocab_size} needs {vocab_size - MIN_VOCAB_SIZE}: train on "
            "more text (more shards, a larger --max_chars) or ask for a smaller --vocab_size"
        )
    if verbose:
        print(f"Training time: {time.monotonic() - t0:.2f}s", flush=True)  # HEAD's line
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    tokenizer = tokenizer_from_tiktoken(ranks, specials, trainer.get_pattern())
    tokenizer.init_kwargs[TOKEN_BYTES_KEY] = "raw"  # HEAD's token_bytes.pt since its commit 2ce972a
    return tokenizer


@contextmanager
def _rustbpe_progress(enabled: bool) -> Iterator[None]:
    """rustbpe logs its counting and each percent of the merges to the Python logger "rustbpe" at INFO: while it
    trains, show them on stderr (nanochat's logging setup does)."""
    logger = logging.getLogger("rustbpe")
    if not enabled:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tok_train: %(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def check_output_dir(output_dir: str | os.PathLike, overwrite: bool) -> None:
    """Before training: `output_dir` holds no tokenizer (unless `overwrite`) and can be written."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output_dir {output_dir} is a file; expected a directory (or a path that does not exist)")
    found = [name for name in TOKENIZER_FILES if (output_dir / name).exists()]
    if found and not overwrite:
        raise UserError(
            f"--output_dir {output_dir} already holds a tokenizer ({', '.join(found)}): pass --overwrite to replace "
            "it, or choose another --output_dir"
        )
    existing = next(p for p in (output_dir, *output_dir.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise UserError(f"--output_dir {output_dir} cannot be written ({existing} is not writable)")


def save_tokenizer_dir(
    tokenizer: PreTrainedTokenizerFast, output_dir: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write the Hugging Face tokenizer (tokenizer.json, config, chat template) and nanochat's tokenizer.pkl and
    token_bytes.pt into `output_dir`, all staged first: a new folder appears whole, an existing one has each file
    replaced atomically (only with `overwrite`); other files in it are kept. Read it back with `load_tokenizer_dir`.
    """
    with staged_dir(output_dir, overwrite) as tmp:
        tokenizer.save_pretrained(tmp)
        for name, data in nanochat_tokenizer_files(tokenizer).items():
            (tmp / name).write_bytes(data)
    return Path(output_dir)


def train_from_shards(
    data_dir: str | os.PathLike | None,
    output_dir: str | os.PathLike,
    vocab_size: int = VOCAB_SIZE,
    max_chars: int = MAX_CHARS,
    doc_cap: int = DOC_CAP,
    overwrite: bool = False,
) -> PreTrainedTokenizerFast:
    """scripts/tok_train.py: check everything, read and train with progress lines, save. `data_dir` None: HEAD's
    folder (`pretraining.default_data_dir`)."""
    check_vocab_size(vocab_size)
    for name, value in (("--max_chars", max_chars), ("--doc_cap", doc_cap)):
        if value <= 0:
            raise UserError(f"{name} {value}: expected a positive number of characters")
    check_output_dir(output_dir, overwrite)
    shards = split_shards(list_shards(data_dir), "train")
    print(f"max_chars: {max_chars:,}\ndoc_cap: {doc_cap:,}\nvocab_size: {vocab_size:,}")
    where = Path(shards[0]).parent
    print(f"reading {len(shards)} train shard(s) of {where} (the last shard, validation, is left out)", flush=True)
    with Progress("tok_train: reading text", total=max_chars, unit="chars") as progress:

        def documents() -> Iterator[str]:
            for doc in capped_documents(shard_documents(shards), max_chars, doc_cap):
                progress.update(len(doc))
                yield doc
            progress.close()

        tokenizer = train_bpe(documents(), vocab_size, verbose=True)
    save_tokenizer_dir(tokenizer, output_dir, overwrite)
    print(
        f"Saved the tokenizer ({len(tokenizer):,} tokens; Hugging Face files, tokenizer.pkl, token_bytes.pt) "
        f"to {output_dir}"
    )
    return tokenizer
