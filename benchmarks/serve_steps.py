"""The server's batcher step by step (no HTTP), ours against another commit's batcher on the same model in the same
run: where a request's time goes beside the abuse benchmark's longest generation.

    python benchmarks/serve_steps.py                      # against ee913bd (before Slots: DynamicCache)
    python benchmarks/serve_steps.py --against COMMIT --generation G5

Both batchers are driven in this thread (their worker threads stopped), old and new interleaved, --repeats times;
each cell is the median (and the fastest) of all its timings, in ms, 1 thread. Rows: a decoding step for 1 and 8
requests with short caches; the long request alone (~560 columns); a short request's prefill and join beside it,
the steps the two share, and the step where the short one leaves.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_load import QUESTIONS, random_model_dir

ROOT = Path(__file__).resolve().parents[1]
BATCHER = "src/nanochat_hf/serving/batcher.py"


class Sink:
    """Takes the tokens, stops at nothing."""

    def __init__(self):
        self.finished, self.cancelled = False, threading.Event()

    def add(self, tokens: list[int]) -> None:
        pass

    def end(self) -> None:
        pass

    def fail(self, message: str, status: int = 500) -> None:
        raise SystemExit(f"a request failed: {message}")


def batcher_at(commit: str, folder: Path):
    """That commit's serving/batcher.py as a module (its relative imports made absolute)."""
    source = subprocess.run(["git", "show", f"{commit}:{BATCHER}"], cwd=ROOT, capture_output=True, text=True)
    if source.returncode:
        raise SystemExit(f"--against {commit}: {source.stderr.strip()}")
    path = folder / f"batcher_{commit}.py"
    path.write_text(source.stdout.replace("from ..", "from nanochat_hf."))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = sys.modules[path.stem] = importlib.util.module_from_spec(spec)  # dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def measure(module, model, tokenizer, prompts: list[list[int]], long: list[int], short: list[int]) -> dict:
    """Timings (s) of one pass over the rows, for this batcher module."""

    def batcher():
        b = module.Batcher(model, tokenizer, max_batch=32, max_queue=64)
        b.stop()  # driven from here, step by step
        b.stopping = False
        return b

    def job(prompt: list[int], sampled: bool = False):
        sampling = (0.8, None, 1) if sampled else (0.0, None, None)
        return module.Job(prompt, 10**6, *sampling, calculator=True, sink=Sink())

    def timed(step) -> float:
        began = time.perf_counter()
        step()
        return time.perf_counter() - began

    times = {}
    for rows in (1, 8):
        b = batcher()
        b._admit([job(prompts[i % len(prompts)], i % 2 == 1) for i in range(rows)])
        times[f"decoding step, {rows} request(s), 14-44 columns"] = [timed(b._decode) for _ in range(30)]
    b = batcher()
    b._admit([job(long)])
    for _ in range(400):
        b._decode()
    times["decoding step, the long request alone (~560 columns)"] = [timed(b._decode) for _ in range(20)]
    joins, shared, leaves = [], [], []
    for _ in range(10):
        s = job(short)
        joins.append(timed(lambda: b._admit([s])))
        shared += [timed(b._decode) for _ in range(6)]
        s.sink.cancelled.set()
        leaves.append(timed(b._decode))
    times["a short request's prefill and join beside it"] = joins
    times["decoding step, the long request and the short one"] = shared
    times["the step where the short one leaves"] = leaves
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="ee913bd", help="the commit whose batcher is the baseline")
    parser.add_argument("--generation", choices=["G0", "G5"], default="G0")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from transformers import AutoTokenizer

    from nanochat_hf import NanoChatGPTForCausalLM
    from nanochat_hf.serving import batcher as ours
    from nanochat_hf.tokenizer import render_for_completion

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_model_dir(Path(tmp) / args.generation, args.depth, args.generation)
        theirs = batcher_at(args.against, Path(tmp))
        model = NanoChatGPTForCausalLM.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)

        def render(text: str) -> list[int]:
            return render_for_completion(tokenizer, {"messages": [{"role": "user", "content": text}]})

        prompts, long, short = (
            [render(q) for q in QUESTIONS],
            render("Tell me everything you know. " * 20),
            render("hi"),
        )
        results = {args.against: {}, "ours": {}}
        with torch.inference_mode():
            for _ in range(args.repeats):
                for name, module in ((args.against, theirs), ("ours", ours)):
                    for row, values in measure(module, model, tokenizer, prompts, long, short).items():
                        results[name].setdefault(row, []).extend(values)
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        print(f"\n{args.generation}, depth {args.depth}, 1 thread; load average {load}")
        print(f"| ms, median (fastest) | {args.against} | ours | {args.against} / ours (medians) |")
        print("|---|---|---|---|")
        for row, old in results[args.against].items():
            new = results["ours"][row]
            cells = [f"{statistics.median(v) * 1e3:.2f} ({min(v) * 1e3:.2f})" for v in (old, new)]
            print(f"| {row} | {cells[0]} | {cells[1]} | {statistics.median(old) / statistics.median(new):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
