"""nanochat's tokenizer directory (`tokenizer.pkl` + `token_bytes.pt`) <-> our fast tokenizer.

`tokenizer.pkl` is a pickled `tiktoken.Encoding`. Unpickling can run arbitrary code, so loading needs the
caller's explicit `trust_pickle=True`; even then the unpickler only accepts tiktoken's Encoding (read as
plain data, so tiktoken need not be installed) and refuses any other object. `load_tokenizer_dir` reads a folder
scripts/tok_train.py wrote (its Hugging Face files, no pickle) or one nanochat prepared (tokenizer.pkl, opt-in).
"""

from __future__ import annotations

import copyreg
import io
import json
import os
import pickle
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from ..atomic import write_bytes
from ..errors import UserError, one_line
from .chat_format import SPECIAL_TOKENS
from .tokenizer import (
    TOKEN_BYTES_CONVENTIONS,
    TOKEN_BYTES_KEY,
    build_tokenizer,
    bytes_to_token,
    to_mergeable_ranks,
    token_bytes,
)


class _EncodingState:
    """Stands in for tiktoken.Encoding while unpickling: keeps the pickled state as a dict."""

    def __setstate__(self, state: object) -> None:
        self.state = state


class _EncodingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in {("tiktoken.core", "Encoding"), ("tiktoken", "Encoding")}:
            return _EncodingState
        if (module, name) == ("copyreg", "_reconstructor"):  # pickle protocols 0/1
            return copyreg._reconstructor
        if (module, name) == ("builtins", "object"):
            return object
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: only tiktoken.Encoding is expected")


def read_tiktoken_pickle(path: str | os.PathLike) -> dict:
    """{pat_str, mergeable_ranks, special_tokens} of a pickled tiktoken.Encoding (caller has opted in)."""
    path = Path(path)
    try:
        obj = _EncodingUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
        raise UserError(f"{path}: not a pickled tiktoken.Encoding ({e})") from None
    state = getattr(obj, "state", None)
    if isinstance(state, str):
        raise UserError(f"{path}: pickles tiktoken's registered encoding {state!r} by name, not a nanochat vocab")
    if not isinstance(state, dict) or not {"pat_str", "mergeable_ranks", "special_tokens"} <= state.keys():
        raise UserError(f"{path}: not a pickled tiktoken.Encoding (no pat_str/mergeable_ranks/special_tokens)")
    return state


def _merge_for(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair tiktoken merges last to build `token`: its byte-pair encoding with only lower-ranked merges."""
    rank = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise UserError(f"token {token!r} (rank {rank}) cannot be built by merging lower-ranked tokens")
    return parts[0], parts[1]


def tokenizer_from_tiktoken(
    mergeable_ranks: dict[bytes, int], special_tokens: dict[str, int], pat_str: str
) -> PreTrainedTokenizerFast:
    """Fast tokenizer giving the same ids as `tiktoken.Encoding(pat_str, mergeable_ranks, special_tokens)`."""
    missing = [t for t in SPECIAL_TOKENS if t not in special_tokens]
    if missing:
        raise UserError(f"special_tokens lacks nanochat's {missing}")
    singles = [bytes([b]) for b in range(256) if bytes([b]) not in mergeable_ranks]
    if singles:
        raise UserError(f"mergeable_ranks lacks {len(singles)} single bytes (e.g. {singles[0]!r})")
    vocab = {bytes_to_token(t): r for t, r in mergeable_ranks.items()}
    ids = list(vocab.values()) + list(special_tokens.values())
    if len(set(ids)) != len(ids):
        raise UserError("mergeable_ranks and special_tokens reuse some ids")
    # Merges in rank order: the BPE model then applies them with the same priority as tiktoken.
    merges = [
        (bytes_to_token(a), bytes_to_token(b))
        for t, _ in sorted(mergeable_ranks.items(), key=lambda kv: kv[1])
        if len(t) > 1
        for a, b in [_merge_for(t, mergeable_ranks)]
    ]
    vocab.update(special_tokens)  # specials keep their ids; build_tokenizer marks them special
    return build_tokenizer(vocab, merges, pattern=pat_str)


def load_nanochat_tokenizer(tokenizer_dir: str | os.PathLike, trust_pickle: bool = False) -> PreTrainedTokenizerFast:
    """Convert nanochat's tokenizer directory (tokenizer.pkl + token_bytes.pt) to our fast tokenizer.

    Ids are identical to nanochat's tiktoken encoding. `trust_pickle=True` is required: tokenizer.pkl is a pickle.
    token_bytes.pt may follow either of nanochat's byte-count conventions (raw bytes since its commit 2ce972a,
    decoded strings before): the one it follows is kept on the tokenizer, so bits per byte uses the file's counts
    and `save_nanochat_tokenizer` writes the same file back.
    """
    tokenizer_dir = Path(tokenizer_dir)
    pkl = tokenizer_dir / "tokenizer.pkl"
    if not pkl.is_file():
        raise FileNotFoundError(f"{pkl}: no such file (expected nanochat's tokenizer directory)")
    if not trust_pickle:
        raise UserError(
            f"{pkl} is a pickle, and unpickling a file can run arbitrary code: load it only from a source you "
            "trust, by passing trust_pickle=True (command line: --trust-pickle)"
        )
    state = read_tiktoken_pickle(pkl)
    tokenizer = tokenizer_from_tiktoken(state["mergeable_ranks"], state["special_tokens"], state["pat_str"])
    tb_path = tokenizer_dir / "token_bytes.pt"
    if not tb_path.is_file():
        warnings.warn(
            f"{tb_path} not found: token byte lengths are computed from the vocab, as nanochat did "
            "before 2ce972a (decoded strings)",
            stacklevel=2,
        )
        return tokenizer
    try:
        counts = torch.load(tb_path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here means a corrupt or foreign file
        raise UserError(f"{tb_path}: cannot be read as a tensor ({e})") from None
    tokenizer.init_kwargs[TOKEN_BYTES_KEY] = token_bytes_file_convention(tokenizer, counts, tb_path)
    return tokenizer


def token_bytes_file_convention(tokenizer: PreTrainedTokenizerFast, counts: object, path: str | os.PathLike) -> str:
    """Which of nanochat's conventions a token_bytes.pt tensor follows: "raw" (its tok_train.py since 2ce972a) or
    "decoded" (before). One-line UserError naming the first token that follows neither."""
    candidates = {c: token_bytes(tokenizer, c) for c in TOKEN_BYTES_CONVENTIONS}
    n = len(tokenizer)
    if not isinstance(counts, torch.Tensor) or counts.shape != (n,) or counts.is_floating_point():
        shape = (
            f"{counts.dtype} tensor of shape {tuple(counts.shape)}"
            if isinstance(counts, torch.Tensor)
            else type(counts).__name__
        )
        raise UserError(f"{path}: expected an integer tensor of shape ({n},) for the vocab, got {shape}")
    counts = counts.long()
    for convention, expected in candidates.items():
        if torch.equal(counts, expected):
            return convention
    closest = min(candidates, key=lambda c: int((counts != candidates[c]).sum()))
    bad = int((counts != candidates[closest]).nonzero()[0, 0])
    raise UserError(
        f"{path}: token {bad} counts {int(counts[bad])} bytes, which follows neither of nanochat's conventions: "
        f"its raw bytes are {int(candidates['raw'][bad])} (nanochat since 2ce972a), its decoded string has "
        f"{int(candidates['decoded'][bad])} UTF-8 bytes (before)"
    )


def nanochat_tokenizer_files(tokenizer: PreTrainedTokenizerFast) -> dict[str, bytes]:
    """The bytes of nanochat's tokenizer files: tokenizer.pkl (a tiktoken.Encoding named "rustbpe", as nanochat's
    RustBPETokenizer names it, so a tokenizer trained here pickles to the same bytes as tok_train.py's) and
    token_bytes.pt (int32, in the tokenizer's byte-count convention: the one its own token_bytes.pt followed).

    Needs tiktoken."""
    try:
        import tiktoken  # optional dependency (the [tiktoken] extra), needed only here
    except ImportError as e:
        raise ImportError("writing tokenizer.pkl needs tiktoken: pip install 'nanochat-hf[tiktoken]'") from e
    ranks, specials = to_mergeable_ranks(tokenizer)
    # in id order: the vocab comes from a hash map, and a fixed order makes tokenizer.pkl the same bytes every time
    ranks = dict(sorted(ranks.items(), key=lambda kv: kv[1]))
    specials = dict(sorted(specials.items(), key=lambda kv: kv[1]))
    pattern = _split_pattern(tokenizer)
    enc = tiktoken.Encoding(name="rustbpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    token_lengths = io.BytesIO()
    torch.save(token_bytes(tokenizer).to(torch.int32), token_lengths)
    return {"tokenizer.pkl": pickle.dumps(enc), "token_bytes.pt": token_lengths.getvalue()}


def save_nanochat_tokenizer(tokenizer: PreTrainedTokenizerFast, tokenizer_dir: str | os.PathLike) -> Path:
    """Write nanochat's tokenizer directory (`nanochat_tokenizer_files`). Needs tiktoken. Files are written to
    temporaries then renamed into place."""
    files = nanochat_tokenizer_files(tokenizer)
    tokenizer_dir = Path(tokenizer_dir)
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_bytes(tokenizer_dir / name, data)
    return tokenizer_dir


def load_tokenizer_dir(tokenizer_dir: str | os.PathLike, trust_pickle: bool = False) -> PreTrainedTokenizerFast:
    """The tokenizer of a folder `scripts/tok_train.py` wrote, or of one nanochat's own tok_train.py prepared.

    Where the Hugging Face files are (tokenizer.json, as tok_train.py writes them beside tokenizer.pkl) they are
    read and nothing is unpickled; a token_bytes.pt beside them must agree with them (nanochat's tok_train.py run
    into the same folder later rewrites tokenizer.pkl and token_bytes.pt, not tokenizer.json: that is refused in
    one line rather than loading the stale vocabulary). Otherwise this is `load_nanochat_tokenizer`: tokenizer.pkl,
    which is a pickle, read only with `trust_pickle=True`.
    """
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        if not (tokenizer_dir / "tokenizer.pkl").is_file():
            raise FileNotFoundError(
                f"{tokenizer_dir}: no tokenizer (neither tokenizer.json nor tokenizer.pkl): train one with "
                "scripts/tok_train.py"
            )
        return load_nanochat_tokenizer(tokenizer_dir, trust_pickle=trust_pickle)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception on a damaged tokenizer.json
        raise UserError(f"{tokenizer_dir / 'tokenizer.json'}: cannot be loaded ({one_line(e)})") from None
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        raise UserError(f"{tokenizer_dir / 'tokenizer.json'}: lacks nanochat's special tokens {missing}")
    tb_path = tokenizer_dir / "token_bytes.pt"
    if tb_path.is_file():
        try:
            counts = torch.load(tb_path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any failure here means a corrupt or foreign file
            raise UserError(f"{tb_path}: cannot be read as a tensor ({e})") from None
        try:
            tokenizer.init_kwargs[TOKEN_BYTES_KEY] = token_bytes_file_convention(tokenizer, counts, tb_path)
        except UserError as e:
            raise UserError(
                f"{tb_path} does not match tokenizer.json beside it (was the folder rewritten by another trainer, "
                f"e.g. nanochat's tok_train.py?): retrain with scripts/tok_train.py --overwrite, or remove "
                f"tokenizer.json to load tokenizer.pkl ({e})"
            ) from None
    return tokenizer


def _split_pattern(tokenizer: PreTrainedTokenizerFast) -> str:
    """The Split regex of our pre-tokenizer, read back from the serialized tokenizer."""
    pre = json.loads(tokenizer.backend_tokenizer.to_str())["pre_tokenizer"]
    for p in pre.get("pretokenizers", [pre]):
        if p.get("type") == "Split":
            return p["pattern"]["Regex"]
    raise UserError("tokenizer has no Split regex pre-tokenizer: not a nanochat tokenizer")
