"""nanochat's chat evaluation of a model: ARC-Easy, ARC-Challenge, MMLU, GSM8K, HumanEval, SpellingBee; ChatCORE.

    python scripts/chat_eval.py --model DIR_OR_REPO [--tasks ARC-Easy,GSM8K] [--max_problems 100]
    accelerate launch scripts/chat_eval.py --model DIR_OR_REPO          # each process takes a share
    python scripts/chat_eval.py --model DIR --data_files GSM8K=gsm8k_test.jsonl --tasks GSM8K   # offline copies

Prints a table (task, mode, accuracy, baseline, centered, n) and ChatCORE; --report adds it to a report.md.
HumanEval runs the model's code in a sandboxed subprocess (time, memory and file-size limits, no sockets, a
temporary working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli
from nanochat_hf.tasks import EVAL_TASKS, check_data_file, hub_off, task_by_name

# torch, accelerate and the model stack are imported in evaluate(), once the arguments are read: --help and
# argument errors answer at once
PROG = "chat_eval"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory or Hub repo id (tokenizer alongside)")
    parser.add_argument("--tasks", default=",".join(EVAL_TASKS), help="comma-separated (default: all six)")
    parser.add_argument("--max_problems", type=int, default=None, help="per task: the first N after the shuffle")
    parser.add_argument("--batch_size", type=int, default=8, help="problems per forward / generate call (default 8)")
    parser.add_argument(
        "--max_new_tokens", type=int, default=512, help="generative tasks: at most this many reply tokens (default 512)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top_k", type=int, default=50, help="sampling: the k most likely tokens (default 50; 0: all)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    parser.add_argument(
        "--data_files",
        action="append",
        default=[],
        metavar="TASK=FILE[,FILE]",
        help="local copies of a task's hub data, in its column layout (repeatable)",
    )
    parser.add_argument("--report", default=None, help="add the results section to this report.md")
    parser.add_argument("--json", default=None, help="also write the per-task results to this JSON file")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 on cuda, float32 otherwise"
    )
    parser.add_argument(
        "--num_threads",
        type=int,
        default=None,
        help="CPU threads per process, 1 to the cores (default: the cores idle when it starts, divided among "
        "the processes; as mid_train)",
    )
    add_version(parser)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """UserError in one line saying what is wrong with the arguments."""
    args.tasks = [task_by_name(t.strip()).name for t in args.tasks.split(",") if t.strip()]
    files = {}
    for item in args.data_files:
        name, eq, paths = item.partition("=")
        if not eq or not paths:
            raise UserError(f"--data_files {item!r}: expected TASK=FILE[,FILE]")
        files[task_by_name(name).name] = paths.split(",")
    missing = [f for paths in files.values() for f in paths if not Path(f).is_file()]
    if missing:
        raise UserError(f"--data_files: no such file {missing[0]}")
    args.data_files = files
    if not args.tasks:
        raise UserError("--tasks: no task given")
    if (args.max_problems is not None and args.max_problems < 1) or args.batch_size < 1 or args.max_new_tokens < 1:
        raise UserError("--max_problems, --batch_size and --max_new_tokens must be >= 1")
    if args.temperature < 0 or args.top_k < 0:
        raise UserError("--temperature and --top_k must be >= 0")


def check_inputs(args: argparse.Namespace) -> None:
    """Everything that can be checked before the model is loaded and the evaluation runs; UserError / OSError in
    one line: data files (empty, not JSON, binary, not parquet), the --json / --report paths writable."""
    for task, paths in args.data_files.items():
        for path in paths:
            check_data_file(path, f"--data_files {task}")
    for flag, target in (("--json", args.json), ("--report", args.report)):
        if target:
            _check_writable(flag, Path(target))


def _check_writable(flag: str, target: Path) -> None:
    """The results must not be lost after the whole evaluation ran: prove now that `target` can be written."""
    if target.is_dir():
        raise UserError(f"{flag} {target} is a directory; expected a file path")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{flag} {target} is not writable")
    folder = target.parent
    try:  # files are written to a temporary name beside the target and renamed (see nanochat_hf.atomic)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {target}: cannot write in {folder} ({e.strerror})") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: evaluate(args))


def evaluate(args: argparse.Namespace) -> int:
    """Check the arguments and inputs, load the model, evaluate (each process its share), print and write the
    results on the main process; bad input raises UserError / OSError before the evaluation starts."""
    check_args(args)
    check_inputs(args)
    # offline, or the hub not answering: known now, before datasets is imported (and then offline at once)
    hub_tasks = [t for t in args.tasks if EVAL_TASKS[t].kind == "hub" and t not in args.data_files]
    off = hub_off() if hub_tasks else None
    import torch
    from accelerate import PartialState

    from nanochat_hf.evaluation import (
        load_eval_problems,
        results_table,
        run_chat_eval,
        scores_as_dicts,
        write_report_section,
    )
    from nanochat_hf.training.device import check_num_threads, use_cpu_threads
    from nanochat_hf.training.model_source import load_pretrained

    check_num_threads(args.num_threads, f"--num_threads {args.num_threads}")
    # without cuda/mps, several launched processes talk over gloo (accelerate needs to be told it is CPU)
    state = PartialState(cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()))

    def skipped(task: str, reason: str) -> None:
        if state.is_main_process:
            print(f"chat eval {task} skipped: {reason.removeprefix(f'{task}: ')}", file=sys.stderr, flush=True)

    # the data before the model: a task that cannot load is said at once, and none loading is one line (exit 2)
    problems = load_eval_problems(args.tasks, args.data_files, args.max_problems, off, skipped)
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if state.device.type == "cuda" else torch.float32)
    )
    model, tokenizer = load_pretrained(args.model, dtype)
    model = model.to(state.device).eval()
    if state.device.type == "cpu":  # once the model is loaded: measured as the work starts, after any error
        line = use_cpu_threads(args.num_threads, state.num_processes)
        if state.is_main_process:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    scores = run_chat_eval(
        model,
        tokenizer,
        list(problems),  # the tasks whose data loaded (the others were said to be skipped)
        args.max_problems,
        args.batch_size,
        args.max_new_tokens,
        args.temperature,
        args.top_k or None,
        args.seed,
        args.data_files,
        problems=problems,
    )
    if state.is_main_process:
        print(results_table(scores))
        if args.report:
            write_report_section(args.report, scores)
        if args.json:
            Path(args.json).write_text(json.dumps(scores_as_dicts(scores), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
