"""nanochat's base-model evaluation: DCLM CORE, bits per byte and samples, as nanochat's base_eval.py.

    python scripts/base_eval.py --model DIR_OR_REPO                      # CORE, bpb and samples
    python scripts/base_eval.py --model DIR --eval core --max_per_task 100 --bundle_dir ~/eval_bundle
    accelerate launch scripts/base_eval.py --model DIR --eval core       # each process a share of every task

CORE reads nanochat's eval bundle (core.yaml, eval_meta_data.csv, eval_data/): --bundle_dir, by default
$NANOCHAT_BASE_DIR/eval_bundle, downloaded once from nanochat's URL when it is not there. The results go to
stdout and, as nanochat writes them, to $NANOCHAT_BASE_DIR/base_eval/<model>.csv (--csv to choose). Bits per
byte (nanochat's models) reads the pretraining shards ($NANOCHAT_BASE_DIR/base_data_climbmix, --data_dir).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli

# torch, accelerate and the model stack are imported in evaluate(), once the arguments are read: --help and
# argument errors answer at once
PROG = "base_eval"
EVAL_MODES = ("core", "bpb", "sample")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory or Hub repo id (tokenizer alongside)")
    parser.add_argument("--eval", default="core,bpb,sample", help="comma-separated: core, bpb, sample (default: all)")
    parser.add_argument("--bundle_dir", default=None, help="the eval bundle (default: $NANOCHAT_BASE_DIR/eval_bundle)")
    parser.add_argument("--max_per_task", type=int, default=-1, help="CORE: the first N rows of each task (-1: all)")
    parser.add_argument("--batch_size", type=int, default=32, help="CORE: sequences per forward (default 32)")
    parser.add_argument("--device_batch_size", type=int, default=32, help="bpb: rows per forward (default 32)")
    parser.add_argument(
        "--split_tokens", type=int, default=40 * 524288, help="bpb: tokens per split, all ranks (default 40*524288)"
    )
    parser.add_argument("--data_dir", default=None, help="bpb: the shards (default: nanochat's folder)")
    parser.add_argument("--csv", default=None, help="CORE CSV (default: $NANOCHAT_BASE_DIR/base_eval/<model>.csv)")
    parser.add_argument("--json", default=None, help="also write the CORE results to this JSON file")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 on cuda, float32 otherwise"
    )
    parser.add_argument(
        "--num_threads", type=int, default=None, help="CPU threads per process (default: the idle cores, as mid_train)"
    )
    add_version(parser)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    modes = [m.strip() for m in args.eval.split(",") if m.strip()]
    bad = [m for m in modes if m not in EVAL_MODES]
    if bad or not modes:
        raise UserError(f"--eval {args.eval!r}: expected a comma-separated list of {', '.join(EVAL_MODES)}")
    args.eval = modes
    if args.max_per_task == 0 or args.max_per_task < -1:
        raise UserError(f"--max_per_task {args.max_per_task}: expected -1 (all) or >= 1")
    for flag in ("batch_size", "device_batch_size", "split_tokens"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: expected >= 1")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: evaluate(args))


def evaluate(args: argparse.Namespace) -> int:
    check_args(args)
    import torch
    from accelerate import PartialState

    from nanochat_hf.atomic import write_text
    from nanochat_hf.evaluation.base_eval import base_bpb, base_samples, check_bpb, core_csv
    from nanochat_hf.evaluation.core import ensure_bundle, evaluate_core, load_bundle
    from nanochat_hf.paths import nanochat_base_dir
    from nanochat_hf.training.device import check_num_threads, use_cpu_threads
    from nanochat_hf.training.model_source import load_pretrained

    check_num_threads(args.num_threads, f"--num_threads {args.num_threads}")
    # without cuda/mps, several launched processes talk over gloo (accelerate needs to be told it is CPU)
    state = PartialState(cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()))
    csv_path = None
    if "core" in args.eval:  # the bundle is checked (and fetched) before the model is loaded
        bundle = ensure_bundle(args.bundle_dir)
        load_bundle(bundle, args.max_per_task)
        slug = args.model.rstrip("/").replace("/", "--") if not Path(args.model).is_dir() else Path(args.model).name
        csv_path = Path(args.csv) if args.csv else nanochat_base_dir() / "base_eval" / f"{slug}.csv"
        csv_path.parent.mkdir(parents=True, exist_ok=True)  # an unwritable place fails now, not after the run
        if args.json and not Path(args.json).parent.is_dir():
            raise UserError(f"--json {args.json}: no such folder {Path(args.json).parent}")
    if "bpb" in args.eval:  # the shards too
        check_bpb(args.data_dir)
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if state.device.type == "cuda" else torch.float32)
    )
    model, tokenizer = load_pretrained(args.model, dtype)
    model = model.to(state.device).eval()
    if "bpb" in args.eval:
        check_bpb(args.data_dir, model)
    if state.device.type == "cpu":
        line = use_cpu_threads(args.num_threads, state.num_processes)
        if state.is_main_process:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)
    say = print if state.is_main_process else (lambda *a, **k: None)
    say(f"Evaluating model: {args.model}\nEval modes: {', '.join(sorted(args.eval))}")

    if "sample" in args.eval and state.is_main_process:
        say("\n" + "=" * 80 + "\nModel Samples\n" + "=" * 80)
        conditioned, unconditioned = base_samples(model, tokenizer)
        say("\nConditioned samples:")
        for text in conditioned:
            say("-" * 80 + "\n" + text)
        say("\nUnconditioned samples:")
        for text in unconditioned:
            say("-" * 80 + "\n" + text)

    if "bpb" in args.eval:
        say("\n" + "=" * 80 + "\nBPB Evaluation\n" + "=" * 80)
        bpb = base_bpb(model, tokenizer, args.device_batch_size, args.split_tokens, args.data_dir)
        for split, value in bpb.items():
            say(f"{split} bpb: {value:.6f}")

    if "core" in args.eval:
        say("\n" + "=" * 80 + "\nCORE Evaluation\n" + "=" * 80)
        core = evaluate_core(model, tokenizer, bundle, args.max_per_task, args.batch_size)
        if state.is_main_process:
            write_text(csv_path, core_csv(core))
            if args.json:
                write_text(args.json, json.dumps(core, indent=1) + "\n")
            say(f"\nResults written to: {csv_path}\nCORE metric: {core['core_metric']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
