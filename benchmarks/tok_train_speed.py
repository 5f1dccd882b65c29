"""Tokenizer training time: scripts/tok_train.py beside HEAD's tok_train.py algorithm, on the same text in one run.

    python benchmarks/tok_train_speed.py [--data_dir DIR] [--docs_per_shard 4000] [--vocab_size 8192]
        [--max_chars 2000000000] [--doc_cap 10000] [--repeats 2]

The text: the shards of --data_dir, or synthetic ones (`write_synthetic_shards`: 3 shards of english words, the
last for validation) written to a temporary folder. Three ways to the tokenizer, --repeats times each, in
alternating order (the best time of each is shown):

- HEAD: what nanochat's tok_train.py runs, restated: pyarrow row groups (nanochat/dataset.py's
  `parquets_iter_batched`), its text_iterator, rustbpe directly, the tiktoken Encoding, token_bytes, the two files;
- ours: `train_from_shards` (the shards read through `datasets`, rustbpe, the fast tokenizer, the HF files, the
  tokenizer.pkl and token_bytes.pt), as scripts/tok_train.py;
- HF BpeTrainer: `train_tokenizer` (the tokenizers library's trainer) on the same capped documents, with whether
  its merges equal rustbpe's.

Also the reading alone (no training) of HEAD's reader and ours, and ours' work after training (rustbpe's merges to
the fast tokenizer and the five files). Ratios are ours / HEAD (the last: of ours' whole): above 1 is slower.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import platform
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch


def head_documents(shards: list[str], max_chars: int, doc_cap: int):
    """nanochat's parquets_iter_batched(split="train") and tok_train.py's text_iterator."""
    nchars = 0
    for path in shards:
        pf = pq.ParquetFile(path)
        for rg_idx in range(pf.num_row_groups):
            for doc in pf.read_row_group(rg_idx).column("text").to_pylist():
                doc = doc[:doc_cap] if len(doc) > doc_cap else doc
                nchars += len(doc)
                yield doc
                if nchars > max_chars:
                    return


def head_tok_train(shards: list[str], out: Path, vocab_size: int, max_chars: int, doc_cap: int) -> dict[bytes, int]:
    import rustbpe
    import tiktoken

    from nanochat_hf.tokenizer import SPECIAL_TOKENS, SPLIT_PATTERN

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(
        head_documents(shards, max_chars, doc_cap), vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN
    )
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    enc = tiktoken.Encoding(name="rustbpe", pat_str=tok.get_pattern(), mergeable_ranks=ranks, special_tokens=specials)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.pkl").write_bytes(pickle.dumps(enc))
    special_ids = set(specials.values())
    sizes = [0 if i in special_ids else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)]
    with open(out / "token_bytes.pt", "wb") as f:  # a file object, as HEAD (a path would name the archive apart)
        torch.save(torch.tensor(sizes, dtype=torch.int32), f)
    return ranks


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = fn()
    return time.perf_counter() - t0, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=None)
    parser.add_argument("--docs_per_shard", type=int, default=4000)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--max_chars", type=int, default=2_000_000_000)
    parser.add_argument("--doc_cap", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tok_train_speed-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, tmp: Path) -> None:
    from nanochat_hf.data.pretraining import list_shards, split_shards, write_synthetic_shards
    from nanochat_hf.tokenizer import SPECIAL_TOKENS, SPLIT_PATTERN, to_mergeable_ranks, train_tokenizer
    from nanochat_hf.tokenizer.nanochat_format import tokenizer_from_tiktoken
    from nanochat_hf.tokenizer.training import capped_documents, save_tokenizer_dir, shard_documents, train_from_shards

    specials = {name: args.vocab_size - len(SPECIAL_TOKENS) + i for i, name in enumerate(SPECIAL_TOKENS)}

    data_dir = args.data_dir or tmp / "shards"
    if args.data_dir is None:
        write_synthetic_shards(data_dir, num_shards=3, docs_per_shard=args.docs_per_shard, seed=1)
    shards = split_shards(list_shards(data_dir), "train")
    docs = list(head_documents(shards, args.max_chars, args.doc_cap))
    n_chars = sum(map(len, docs))
    print(
        f"{len(docs):,} documents, {n_chars:,} characters from {len(shards)} train shard(s) of {data_dir}; "
        f"vocab_size {args.vocab_size}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {platform.processor()}"
    )

    best = {}
    merges: dict[str, object] = {}
    for repeat in range(args.repeats):
        runs = {
            "read: HEAD (pyarrow row groups)": lambda: sum(
                1 for _ in head_documents(shards, args.max_chars, args.doc_cap)
            ),
            "read: ours (datasets)": lambda: sum(
                1 for _ in capped_documents(shard_documents(shards), args.max_chars, args.doc_cap)
            ),
            "train + save: HEAD (rustbpe directly)": lambda: head_tok_train(
                shards, tmp / "head", args.vocab_size, args.max_chars, args.doc_cap
            ),
            "train + save: ours (tok_train.py)": lambda: to_mergeable_ranks(
                train_from_shards(data_dir, tmp / "ours", args.vocab_size, args.max_chars, args.doc_cap, overwrite=True)
            )[0],
            "of which after training: ours (fast tokenizer, the 5 files)": lambda: save_tokenizer_dir(
                tokenizer_from_tiktoken(merges["train + save: HEAD (rustbpe directly)"], specials, SPLIT_PATTERN),
                tmp / "convert",
                overwrite=True,
            ),
            "train: HF BpeTrainer (train_tokenizer)": lambda: to_mergeable_ranks(
                train_tokenizer(docs, args.vocab_size)
            )[0],
        }
        order = list(runs.items())[:: 1 if repeat % 2 == 0 else -1]  # alternate the order: the load drifts
        order.sort(key=lambda kv: kv[0].startswith("of which"))  # needs HEAD's merges of this repeat
        for name, fn in order:
            seconds, result = timed(fn)
            best[name] = min(best.get(name, seconds), seconds)
            merges[name] = result
    head, ours = (tmp / "head", tmp / "ours")
    same_files = all((head / f).read_bytes() == (ours / f).read_bytes() for f in ("tokenizer.pkl", "token_bytes.pt"))
    rust = merges["train + save: HEAD (rustbpe directly)"]
    hf = merges["train: HF BpeTrainer (train_tokenizer)"]
    order = sorted(rust, key=rust.get)
    hf_order = sorted(hf, key=hf.get)
    parted = next((i for i, (a, b) in enumerate(zip(order, hf_order)) if a != b), None)
    if parted is None and len(order) != len(hf_order):
        parted = min(len(order), len(hf_order))

    print(f"\n| what | best of {args.repeats} (s) | vs HEAD |")
    print("|---|---|---|")
    pairs = {
        "read: ours (datasets)": "read: HEAD (pyarrow row groups)",
        "train + save: ours (tok_train.py)": "train + save: HEAD (rustbpe directly)",
        "train: HF BpeTrainer (train_tokenizer)": "train + save: HEAD (rustbpe directly)",
        "of which after training: ours (fast tokenizer, the 5 files)": "train + save: ours (tok_train.py)",
    }
    for name, seconds in best.items():
        ratio = f"{seconds / best[pairs[name]]:.2f}x" if name in pairs else ""
        print(f"| {name} | {seconds:.2f} | {ratio} |")
    print(f"\nours' tokenizer.pkl and token_bytes.pt equal HEAD's algorithm's, byte for byte: {same_files}")
    print(
        "HF BpeTrainer's merges equal rustbpe's: "
        + ("yes" if parted is None else f"no, they part at merge {parted - 255} of {len(order) - 256}")
    )


if __name__ == "__main__":
    main()
