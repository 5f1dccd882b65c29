"""Compare the trained tokenizer's compression with GPT-2's and GPT-4's, as nanochat's scripts/tok_eval.py does.

    python scripts/tok_eval.py [--tokenizer_dir $NANOCHAT_BASE_DIR/tokenizer]
        [--data_dir $NANOCHAT_BASE_DIR/base_data_climbmix] [--offline] [--trust-pickle]

It prints nanochat's table: bytes, tokens and bytes per token of nanochat's sample texts and of the first row group
of the first train shard and of the validation shard, ours beside each baseline. GPT-2's and GPT-4's tokenizers are
tiktoken's encodings: read from tiktoken's cache, downloaded once when online; with --offline (or HF_HUB_OFFLINE=1)
a baseline that is not cached is skipped, and one line says so. Details: docs/tokenizer.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanochat_hf.errors import OneLineArgumentParser, add_version, run_cli

PROG = "tok_eval"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer_dir", type=Path, default=None, help="default: $NANOCHAT_BASE_DIR/tokenizer")
    p.add_argument("--data_dir", type=Path, default=None, help="default: $NANOCHAT_BASE_DIR/base_data_climbmix")
    p.add_argument("--offline", action="store_true", help="never download GPT-2's / GPT-4's tokenizer")
    p.add_argument(
        "--trust-pickle", action="store_true", help="allow unpickling tokenizer.pkl of a folder nanochat prepared"
    )
    add_version(p)
    return p.parse_args(argv)


def tok_eval(args: argparse.Namespace) -> None:
    from nanochat_hf.data.pretraining import list_shards
    from nanochat_hf.tokenizer import compression, training
    from nanochat_hf.tokenizer.nanochat_format import load_tokenizer_dir

    tokenizer = load_tokenizer_dir(args.tokenizer_dir or training.default_output_dir(), args.trust_pickle)
    shards = list_shards(args.data_dir)
    baselines, missing = compression.load_baselines(args.offline)
    compression.report(
        compression.Encoder.of_transformers(tokenizer), baselines, missing, compression.eval_texts(shards)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: tok_eval(args))


if __name__ == "__main__":
    sys.exit(main())
