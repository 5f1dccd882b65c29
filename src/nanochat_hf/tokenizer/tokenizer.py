"""nanochat's byte-level BPE tokenizer as a `PreTrainedTokenizerFast`: build, train, token_bytes.

What it matches is described in docs/nanochat.md, section 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..errors import UserError
from .chat_format import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS
from .template import CHAT_TEMPLATE

# GPT-4's pattern with numbers split in runs of at most 2 digits. The onig engine of `tokenizers` supports the
# possessive quantifiers (?+, ++); tests check the split against the `regex` module on varied text.
SPLIT_PATTERN: str = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/GPT-4 byte -> printable unicode char map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:  # control chars, space, etc. move above 255 in byte order
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def bytes_to_token(data: bytes) -> str:
    """Byte string -> its byte-level BPE vocabulary entry."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def token_to_bytes(token: str) -> bytes:
    """Byte-level BPE vocabulary entry -> the bytes it stands for."""
    table = unicode_to_bytes()
    return bytes(table[c] for c in token)


def _pre_tokenizer(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _bare_backend(model: models.BPE, pattern: str = SPLIT_PATTERN) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer(pattern)
    tok.decoder = decoders.ByteLevel()
    return tok


def wrap_backend(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a backend that already holds the nine special tokens into the transformers tokenizer.

    Plain ``tokenizer(text)`` prepends ``<|bos|>`` (nanochat scores every document after it), via the
    ``add_bos_token`` post-processor transformers builds, as Llama-style tokenizers do; ``add_special_tokens=False``
    gives none. The chat template writes its own ``<|bos|>`` and ``apply_chat_template`` encodes without special
    tokens, so a chat still has exactly one. Where it is saved beside a model, ``model_max_length`` is set to the
    model's ``sequence_len``.
    """
    missing = [t for t in SPECIAL_TOKENS if backend.token_to_id(t) is None]
    if missing:
        raise UserError(f"tokenizer lacks nanochat special tokens {missing}")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        add_bos_token=True,
        add_eos_token=False,
        extra_special_tokens=list(SPECIAL_TOKENS[1:]),
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def build_tokenizer(
    vocab: dict[str, int], merges: list[tuple[str, str]], pattern: str = SPLIT_PATTERN
) -> PreTrainedTokenizerFast:
    """Fast tokenizer from a byte-level vocab (may already hold the special tokens at their ids) and merges.

    Special tokens missing from `vocab` are appended after it in nanochat's order.
    """
    # ignore_merges: a pre-token that is itself in the vocab maps straight to its id, as tiktoken does.
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=True, byte_fallback=False, fuse_unk=False)
    backend = _bare_backend(model, pattern)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return wrap_backend(backend)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train nanochat's tokenizer: byte-level BPE on `texts`, then the nine special tokens as the last ids.

    The result has at most `vocab_size` tokens (fewer if the texts run out of pairs to merge). Training is
    deterministic: same texts, same vocab_size -> same vocab and merges.
    """
    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special:
        raise UserError(f"vocab_size={vocab_size} is too small: need at least 256 bytes + {n_special} specials")
    backend = _bare_backend(models.BPE(byte_fallback=False, fuse_unk=False, ignore_merges=True))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_special,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token: nothing is unknown
        special_tokens=[],  # the trainer would put them first; nanochat has them last
    )
    backend.train_from_iterator(texts, trainer=trainer)
    # The trainer numbers the 256 byte tokens by their unicode stand-ins; renumber them by byte value, as
    # nanochat does (id b = byte b). Merged tokens keep their ids (>= 256, in merge order).
    model = json.loads(backend.to_str())["model"]
    table = unicode_to_bytes()
    vocab = {t: (table[t] if i < 256 else i) for t, i in model["vocab"].items()}
    return build_tokenizer(vocab, [tuple(m) for m in model["merges"]])


def _special_ids(tokenizer: PreTrainedTokenizerFast) -> set[int]:
    return {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}


# How a token's bytes are counted for bits per byte (docs/nanochat.md, section 2). nanochat's tok_train.py wrote
# token_bytes.pt from each token decoded on its own until commit 2ce972a ("decoded": invalid UTF-8 such as a lone
# byte 0x80-0xFF decodes to U+FFFD, 3 bytes), and from its raw bytes since ("raw": 1 byte). A tokenizer keeps the
# convention of the token_bytes.pt it came with in its init kwargs (so tokenizer_config.json); without one it
# counts "decoded", as nanochat's December system (G0) does.
TOKEN_BYTES_KEY = "token_bytes_convention"
TOKEN_BYTES_CONVENTIONS: tuple[str, ...] = ("decoded", "raw")


def token_bytes_convention(tokenizer: PreTrainedTokenizerFast) -> str:
    """The tokenizer's byte-count convention: "decoded" (nanochat before 2ce972a, our default) or "raw"."""
    convention = tokenizer.init_kwargs.get(TOKEN_BYTES_KEY, "decoded")
    if convention not in TOKEN_BYTES_CONVENTIONS:
        raise UserError(f"tokenizer's {TOKEN_BYTES_KEY} is {convention!r}, expected one of {TOKEN_BYTES_CONVENTIONS}")
    return convention


def token_bytes(tokenizer: PreTrainedTokenizerFast, convention: str | None = None) -> torch.Tensor:
    """int64 tensor, one entry per token id: the token's byte count for bits per byte, 0 for specials.

    `convention` (default: the tokenizer's own, `token_bytes_convention`): "raw" counts the token's bytes;
    "decoded" the UTF-8 length of the token decoded on its own, as nanochat before 2ce972a: a token whose bytes
    are not valid UTF-8 alone (a single byte 0x80-0xFF, half of a character) decodes with U+FFFD replacements,
    3 bytes each, so the counts of a text's tokens need not add up to its UTF-8 length.
    """
    convention = token_bytes_convention(tokenizer) if convention is None else convention
    if convention not in TOKEN_BYTES_CONVENTIONS:
        raise UserError(f"token_bytes convention {convention!r}, expected one of {TOKEN_BYTES_CONVENTIONS}")
    special = _special_ids(tokenizer)
    added = tokenizer.added_tokens_decoder
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    sizes = torch.zeros(len(tokenizer), dtype=torch.int64)
    for token, idx in vocab.items():
        if idx in special:
            continue
        # a non-special added token is plain text; the rest of the vocab is byte-level encoded
        raw = token.encode("utf-8") if idx in added else token_to_bytes(token)
        sizes[idx] = len(raw) if convention == "raw" else len(raw.decode("utf-8", errors="replace").encode("utf-8"))
    return sizes


def to_mergeable_ranks(tokenizer: PreTrainedTokenizerFast) -> tuple[dict[bytes, int], dict[str, int]]:
    """tiktoken-style (mergeable_ranks bytes->id, special_tokens name->id) with the tokenizer's own ids."""
    special = _special_ids(tokenizer)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    ranks = {token_to_bytes(t): i for t, i in vocab.items() if i not in special}
    specials = {t: i for t, i in vocab.items() if i in special}
    return ranks, specials
