"""Train nanochat's tokenizer as nanochat's scripts/tok_train.py does, and write it where nanochat reads it.

    python scripts/tok_train.py [--max_chars 2000000000] [--doc_cap 10000] [--vocab_size 32768]
        [--data_dir $NANOCHAT_BASE_DIR/base_data_climbmix] [--output_dir $NANOCHAT_BASE_DIR/tokenizer] [--overwrite]

The text is nanochat's: every pretraining shard but the last (validation), in name order, each document cut to
--doc_cap characters, until --max_chars characters are read. The trainer is rustbpe, nanochat's own, so the
vocabulary and merges are nanochat's exactly. --output_dir gets a Hugging Face tokenizer (AutoTokenizer, with the
chat template) and nanochat's tokenizer.pkl and token_bytes.pt (nanochat's base_train reads them unchanged). A
folder that already holds a tokenizer is refused unless --overwrite. Details: docs/tokenizer.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanochat_hf.errors import OneLineArgumentParser, add_version, run_cli

# the heavy libraries (datasets, transformers, rustbpe) are imported after the arguments are checked
PROG = "tok_train"


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # nanochat's flags are spelled --max-chars etc.; both spellings are accepted
    p.add_argument(
        "--max_chars",
        "--max-chars",
        type=positive_int,
        default=2_000_000_000,
        help="characters to train on (default: 2B)",
    )
    p.add_argument(
        "--doc_cap",
        "--doc-cap",
        type=positive_int,
        default=10_000,
        help="characters kept per document (default: 10,000)",
    )
    p.add_argument(
        "--vocab_size",
        "--vocab-size",
        type=positive_int,
        default=32768,
        help="vocabulary size, special tokens included (default: 32768)",
    )
    p.add_argument(
        "--data_dir",
        type=Path,
        default=None,
        help="the parquet shards (default: $NANOCHAT_BASE_DIR/base_data_climbmix)",
    )
    p.add_argument(
        "--output_dir",
        type=Path,
        default=None,
        help="where to write the tokenizer (default: $NANOCHAT_BASE_DIR/tokenizer)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace the tokenizer files of an --output_dir that has them"
    )
    add_version(p)
    return p.parse_args(argv)


def tok_train(args: argparse.Namespace) -> None:
    from nanochat_hf.tokenizer import training

    training.train_from_shards(
        args.data_dir,
        args.output_dir or training.default_output_dir(),
        vocab_size=args.vocab_size,
        max_chars=args.max_chars,
        doc_cap=args.doc_cap,
        overwrite=args.overwrite,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: tok_train(args))


if __name__ == "__main__":
    sys.exit(main())
