"""nanochat's tok_eval.py: how many bytes a token covers, ours beside GPT-2's and GPT-4's tokenizers.

The texts are HEAD's: its five samples (news, korean, code, math, science; verbatim from scripts/tok_eval.py in
tok_eval_texts.json), the first row group of the first train shard ("climbmix-train") and of the validation shard
("climbmix-val", when not empty), each row group's documents joined by newlines. The table is printed as HEAD
prints it, ANSI colours included. GPT-2's and GPT-4's tokenizers are tiktoken's encodings "gpt2" and "cl100k_base":
read from tiktoken's cache, downloaded once when online; offline (`offline=True`, or HF_HUB_OFFLINE=1) a baseline
that is not cached is left out, and one line says which and why. The tokenizer folder is read by
`load_tokenizer_dir` (its Hugging Face files; a folder nanochat prepared with `trust_pickle`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

TEXTS_FILE = Path(__file__).with_name("tok_eval_texts.json")
BASELINES = {"GPT-2": "gpt2", "GPT-4": "cl100k_base"}  # HEAD's columns -> tiktoken encoding names
GREEN, RED, RESET = "\033[92m", "\033[91m", "\033[0m"


class Encoder:
    """What the table needs of a tokenizer: encode without special tokens, decode, vocabulary size."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], vocab_size: int):
        self.encode, self.decode, self.vocab_size = encode, decode, vocab_size

    @classmethod
    def of_tiktoken(cls, enc) -> Encoder:
        return cls(enc.encode_ordinary, enc.decode, enc.n_vocab)

    @classmethod
    def of_transformers(cls, tokenizer) -> Encoder:
        return cls(lambda text: tokenizer.encode(text, add_special_tokens=False), tokenizer.decode, len(tokenizer))


def sample_texts() -> list[tuple[str, str]]:
    return list(json.loads(TEXTS_FILE.read_text(encoding="utf-8")).items())


def first_row_group_text(shard: str) -> str:
    """The documents of the shard's first row group, joined by newlines (HEAD's `next(parquets_iter_batched(...))`)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(shard)
    return "\n".join(pf.read_row_group(0).column("text").to_pylist()) if pf.num_row_groups else ""


def eval_texts(shards: list[str]) -> list[tuple[str, str]]:
    """HEAD's rows: the samples, then climbmix-train (first shard) and climbmix-val (last shard) when not empty."""
    texts = [*sample_texts(), ("climbmix-train", first_row_group_text(shards[0]))]
    if val := first_row_group_text(shards[-1]):
        texts.append(("climbmix-val", val))
    return texts


class _NotCached(Exception):
    pass


@contextmanager
def _tiktoken_downloads(allowed: bool) -> Iterator[None]:
    """tiktoken reads a URL only on a cache miss (tiktoken.load.read_file): refuse it offline, bound it online."""
    import requests
    import tiktoken.load

    read_file = tiktoken.load.read_file

    def fetch(blobpath: str) -> bytes:
        if not allowed:
            raise _NotCached(blobpath)
        response = requests.get(blobpath, timeout=30)
        response.raise_for_status()
        return response.content

    tiktoken.load.read_file = fetch
    try:
        yield
    finally:
        tiktoken.load.read_file = read_file


def load_baselines(offline: bool) -> tuple[dict[str, Encoder], dict[str, str]]:
    """GPT-2's and GPT-4's tokenizers that can be had: ({column: encoder}, {column: why it is left out})."""
    import tiktoken

    offline = offline or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    found, missing = {}, {}
    with _tiktoken_downloads(allowed=not offline):
        for column, name in BASELINES.items():
            try:
                found[column] = Encoder.of_tiktoken(tiktoken.get_encoding(name))
            except _NotCached:
                missing[column] = f"tiktoken's {name!r} is not in its cache and this run is offline"
            except Exception as e:  # noqa: BLE001 - a failed download (no network, proxy, HTTP error)
                missing[column] = f"tiktoken's {name!r} could not be downloaded: {type(e).__name__}"
    return found, missing


def compression(encoder: Encoder, texts: list[tuple[str, str]]) -> dict[str, dict]:
    results = {}
    for name, text in texts:
        encoded = encoder.encode(text)
        if encoder.decode(encoded) != text:
            raise RuntimeError(f"the tokenizer does not decode the {name} text back to itself")
        n_bytes = len(text.encode("utf-8"))
        results[name] = {"bytes": n_bytes, "tokens": len(encoded), "ratio": n_bytes / len(encoded)}
    return results


def print_comparison(baseline_name: str, baseline_results: dict, ours_results: dict, texts: list) -> None:
    """HEAD's table, line for line."""
    print(f"\nComparison with {baseline_name}:")
    print("=" * 95)
    print(f"{'Text Type':<10} {'Bytes':<8} {baseline_name:<15} {'Ours':<15} {'Relative':<12} {'Better':<10}")
    print(f"{'':10} {'':8} {'Tokens':<7} {'Ratio':<7} {'Tokens':<7} {'Ratio':<7} {'Diff %':<12}")
    print("-" * 95)
    for name, _ in texts:
        base, ours = baseline_results[name], ours_results[name]
        # positive: ours needs fewer tokens
        relative_diff = (base["tokens"] - ours["tokens"]) / base["tokens"] * 100
        if base["ratio"] > ours["ratio"]:
            base_color, ours_color, better, diff_color = GREEN, RED, baseline_name, RED
        elif ours["ratio"] > base["ratio"]:
            base_color, ours_color, better, diff_color = RED, GREEN, "Ours", GREEN
        else:
            base_color, ours_color, better, diff_color = "", "", "Tie", ""
        print(
            f"{name:<10} {base['bytes']:<8} "
            f"{base_color}{base['tokens']:<7}{RESET} "
            f"{base_color}{base['ratio']:<7.2f}{RESET} "
            f"{ours_color}{ours['tokens']:<7}{RESET} "
            f"{ours_color}{ours['ratio']:<7.2f}{RESET} "
            f"{diff_color}{relative_diff:+7.1f}%{RESET}     "
            f"{better:<10}"
        )


def print_ours(ours_results: dict, texts: list) -> None:
    """Ours alone, in the same columns, when no baseline could be loaded."""
    print("\nOurs:")
    print("=" * 95)
    print(f"{'Text Type':<10} {'Bytes':<8} {'Ours':<15}")
    print(f"{'':10} {'':8} {'Tokens':<7} {'Ratio':<7}")
    print("-" * 95)
    for name, _ in texts:
        ours = ours_results[name]
        print(f"{name:<10} {ours['bytes']:<8} {ours['tokens']:<7} {ours['ratio']:<7.2f}")


def report(ours: Encoder, baselines: dict[str, Encoder], missing: dict[str, str], texts: list) -> None:
    """What tok_eval prints: HEAD's vocabulary sizes and one comparison per baseline; a line per missing one."""
    results = {column: compression(encoder, texts) for column, encoder in baselines.items()}
    ours_results = compression(ours, texts)
    print("\nVocab sizes:")
    for column in BASELINES:
        if column in baselines:
            print(f"{column}: {baselines[column].vocab_size}")
    print(f"Ours: {ours.vocab_size}")
    if missing:
        print("skipped: " + "; ".join(f"{column} ({why})" for column, why in missing.items()))
    for column in BASELINES:
        if column in baselines:
            print_comparison(column, results[column], ours_results, texts)
    if not baselines:
        print_ours(ours_results, texts)
