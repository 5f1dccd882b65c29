"""Checkpoint conversion between nanochat, our Hugging Face model and transformers' native NanoChat.

    python scripts/convert.py from-nanochat --checkpoint-dir D [--step N] --tokenizer-dir T --output O --trust-pickle
    python scripts/convert.py to-nanochat --model O --output D [--step N]
    python scripts/convert.py to-native --model O --output N
    python scripts/convert.py to-onnx --model O --output X

Every nanochat model generation converts both ways (G0, December 2025, to G5, March 2026 and nanochat today):
from-nanochat tells them apart by the checkpoint's tensor names and meta; to-nanochat writes the files that
nanochat's own loader of that generation reads. to-native exports G0 only (transformers' NanoChat has no later
features). to-onnx writes X/onnx/model.onnx (float32) and X/onnx/model_quantized.onnx (int8), decoders with a KV
cache as Optimum and transformers.js lay them out, for every generation (it needs the onnx extra). The tokenizer is
read from and written to nanochat's layout, <base>/tokenizer beside <base>/<source>_checkpoints/<tag>, unless
--tokenizer-dir / --tokenizer-output say otherwise.

Nothing is ever deleted, and the source files are never replaced. An --output that is not empty (to-nanochat: one
holding files of the names it writes), or that is, contains or is inside the source, is refused unless
--overwrite, which replaces only the files the command writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanochat_hf.errors import OneLineArgumentParser, add_version, run_cli

PROG = "convert"


def step_number(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value!r}")
    return int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    overwrite_help = "replace the files this command writes where they exist (other files, and the source, are kept)"

    p = sub.add_parser("from-nanochat", help="nanochat model_<step>.pt + meta_<step>.json -> Hugging Face directory")
    p.add_argument("--checkpoint-dir", required=True, type=Path, help="e.g. ~/.cache/nanochat/base_checkpoints/d20")
    p.add_argument("--step", type=step_number, default=None, help="checkpoint step (default: the latest)")
    p.add_argument(
        "--tokenizer-dir",
        type=Path,
        default=None,
        help="nanochat tokenizer dir (default: <checkpoint-dir>/../../tokenizer, nanochat's layout)",
    )
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="cast weights (default: keep)")
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow unpickling tokenizer.pkl (it can run code: only for files you trust)",
    )
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)

    p = sub.add_parser("to-nanochat", help="Hugging Face directory -> nanochat model_<step>.pt + meta_<step>.json")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument(
        "--output",
        required=True,
        type=Path,
        help="nanochat checkpoint dir <base>/<folder>/<tag> (other steps there are kept): base_checkpoints, "
        "chatsft_checkpoints (a fine-tuned model: HEAD's chat_eval -i sft, chat_cli, chat_rl read it there), "
        "chatrl_checkpoints, or mid_checkpoints (nanochat before 1ddaad1: G0-G3 models)",
    )
    p.add_argument(
        "--step",
        type=step_number,
        default=None,
        help="step in the file names (default: trainer_state.json's global_step, else the source step)",
    )
    p.add_argument(
        "--tokenizer-output",
        type=Path,
        default=None,
        help="where to write tokenizer.pkl + token_bytes.pt (default: <output>/../../tokenizer, nanochat's "
        "layout: --output <base>/<source>_checkpoints/<tag> puts it in <base>/tokenizer)",
    )
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)

    p = sub.add_parser("to-native", help="export to transformers' built-in NanoChatForCausalLM (no custom code)")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)

    p = sub.add_parser(
        "to-onnx", help="ONNX decoder with a KV cache (float32 and int8) for onnxruntime, transformers.js"
    )
    p.add_argument("--model", required=True, type=Path, help="our model folder (any generation), or a native one")
    p.add_argument(
        "--output",
        required=True,
        type=Path,
        help="a new folder: onnx/model.onnx, onnx/model_quantized.onnx, config, tokenizer, generation config",
    )
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)
    add_version(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: convert(args))


def convert(args: argparse.Namespace) -> None:
    """Bad input (a missing, damaged or foreign file, an --output that is refused) raises UserError or OSError."""
    from nanochat_hf.conversion import from_nanochat, nanochat_tokenizer_dir, to_nanochat, to_native, to_onnx

    if args.command == "from-nanochat":
        tokenizer_dir = args.tokenizer_dir or nanochat_tokenizer_dir(args.checkpoint_dir)
        out = from_nanochat(
            args.checkpoint_dir,
            args.output,
            tokenizer_dir,
            step=args.step,
            dtype=args.dtype,
            trust_pickle=args.trust_pickle,
            overwrite=args.overwrite,
        )
    elif args.command == "to-nanochat":
        out = to_nanochat(
            args.model,
            args.output,
            step=args.step,
            tokenizer_output_dir=args.tokenizer_output,
            overwrite=args.overwrite,
        )
    elif args.command == "to-native":
        out = to_native(args.model, args.output, overwrite=args.overwrite)
    else:
        out = to_onnx(args.model, args.output, overwrite=args.overwrite)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
