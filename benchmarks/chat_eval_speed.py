"""Chat-evaluation speed on the demo-sized model: problems/s of the categorical and the generative mode, and
batched vs one-at-a-time generation, side by side in one run.

    python benchmarks/chat_eval_speed.py [--problems 32] [--max_new_tokens 64] [--batch_size 16] [--threads 1]

The model is a fresh demo-sized `NanoChatGPTForCausalLM` (depth 4: width 256, 2 heads; the demo tokenizer of 4096
tokens, fp32 on CPU unless cuda is there); its weights are random, so every reply runs to --max_new_tokens (the most
work a reply can be). Problems are offline rows in the hub layouts: MMLU-style multiple choice (categorical) and
GSM8K-style questions (generative), from `nanochat_hf.tasks.demo`. Batched and one-at-a-time runs alternate,
--repeats times; the best time of each is shown.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data import demo_tokenizer
from nanochat_hf.evaluation import evaluate_task, load_problems
from nanochat_hf.tasks import EVAL_TASKS, demo
from nanochat_hf.training.device import use_cpu_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: the cores idle when it starts, as chat_eval.py)",
    )
    args = parser.parse_args()
    print(use_cpu_threads(args.threads, flag="--threads"))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = demo_tokenizer()
    torch.manual_seed(0)
    config = NanoChatGPTConfig.from_depth(4, vocab_size=len(tokenizer), sequence_len=1024)  # the demo model
    model = NanoChatGPTForCausalLM(config)
    with torch.no_grad():  # random weights everywhere (nanochat's init zeroes lm_head: every logit would tie)
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model = model.to(device).eval()

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for task, row in (("MMLU", demo.multiple_choice_row), ("GSM8K", demo.arithmetic_row)):
            path = Path(tmp) / f"{task}.jsonl"
            path.write_text("".join(json.dumps(row(i, "test")) + "\n" for i in range(args.problems)))
            files[task] = load_problems(EVAL_TASKS[task], [str(path)])

    runs = [
        ("categorical", "MMLU", 1),
        ("categorical", "MMLU", args.batch_size),
        ("generative", "GSM8K", 1),
        ("generative", "GSM8K", args.batch_size),
    ]
    best: dict[tuple, float] = {}
    for _ in range(args.repeats):
        for mode, task, batch in runs:
            start = time.perf_counter()
            evaluate_task(
                model, tokenizer, EVAL_TASKS[task], files[task], batch_size=batch, max_new_tokens=args.max_new_tokens
            )
            elapsed = time.perf_counter() - start
            best[(mode, task, batch)] = min(best.get((mode, task, batch), elapsed), elapsed)

    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, {device}; {args.problems} problems per run, generation {args.max_new_tokens} "
        f"new tokens per problem, best of {args.repeats}"
    )
    print("| mode | task layout | batch size | problems | seconds | problems/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for mode, task, batch in runs:
        seconds = best[(mode, task, batch)]
        speedup = best[(mode, task, 1)] / seconds
        print(
            f"| {mode} | {task} | {batch} | {args.problems} | {seconds:.2f} | {args.problems / seconds:.1f} | "
            f"{speedup:.1f}x |"
        )


if __name__ == "__main__":
    main()
