"""Pretraining throughput: scripts/base_train.py against nanochat HEAD's scripts/base_train.py executing, on the same
model, shards and tokenizer in one run, with 1 and 2 processes (ours: ZeRO-2, our default, and FSDP2).

    python benchmarks/base_train_speed.py [--nanochat DIR] [--repeats 3] [--steps 24] [--warmup 6]
        [--rows w1,w2,fsdp2] [--depth 2] [--aspect_ratio 64] [--head_dim 64] [--max_seq_len 256]
        [--device_batch_size 4] [--grad_accum 2] [--vocab_size 2048]
    python benchmarks/base_train_speed.py --no_head       # ours only (no nanochat checkout)

HEAD: nanochat's tree at --nanochat (default $NANOCHAT_DIR, else /work/nanochat-ref), run unchanged through this
script's `--head_worker` (runpy of its scripts/base_train.py, as tests/training/data/make_base_train_reference.py
runs it): CPU, NANOCHAT_DTYPE=float32, `torch.compile` the identity (eager, as ours with --torch_compile false),
wandb stubbed when not installed; it needs tiktoken (its tokenizer.pkl). With 2 processes HEAD's compute_init makes
a process group on CUDA only (on CPU its torchrun ranks would train side by side without communicating), so the
worker makes a gloo one, and HEAD's MuonAdamW then reduces and gathers across the ranks as on GPUs, through a shim:
gloo's reduce_scatter and all_gather works have no futures on CPU ("Work::getFuture not implemented" at HEAD's
first step), so each of HEAD's three collectives runs to completion and hands back a finished future: the same
collectives and bytes, without HEAD's overlap of its reductions with the next launches.
Ours: scripts/base_train.py with --torch_compile false. Two processes: `torchrun --nproc_per_node 2` for both (gloo);
ours shards the optimizer (ZeRO-2, its default) or, in the fsdp2 row, the model too (`--fully_shard true`); both
W = 2 rows are set against the same HEAD W = 2 run of their round.

Same for both: synthetic shards (`write_synthetic_shards`), one tokenizer (trained here; HF files for ours, HEAD's
tokenizer.pkl and token_bytes.pt written from it), the model (--depth, --aspect_ratio, --head_dim, window pattern L),
device batch x sequence x processes x --grad_accum tokens per step, 1 torch thread per process (OMP_NUM_THREADS=1),
float32 on CPU. No CORE, no samples; validation (eval_tokens one micro-batch) only at step 0 and after the last
step, outside the measured steps.

Measured: the time between consecutive step lines as they arrive on stdout (everything a step costs: data, forward,
backward, optimizer, logging, callbacks), over the steps after the first --warmup and before the last; tok/s is the
step's tokens over the median of those intervals, "printed" the tokens over the median of the dt each prints. The
rows run back to back in every round (alternating order: the load on a shared machine drifts); "/ HEAD" is the median
over the rounds of ours / HEAD of the same round.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import runpy
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^step (\d+)/(\d+) .*\| dt: ([\d.]+)ms")
ROWS = {"w1": ("W=1", 1, []), "w2": ("W=2 ZeRO-2 (default)", 2, []), "fsdp2": ("W=2 FSDP2", 2, ["--fully_shard"])}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanochat", type=Path, default=Path(os.environ.get("NANOCHAT_DIR", "/work/nanochat-ref")))
    p.add_argument("--no_head", action="store_true", help="ours only")
    p.add_argument("--rows", default="w1,w2,fsdp2", help=f"comma-separated, of {','.join(ROWS)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--aspect_ratio", type=int, default=64)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--max_seq_len", type=int, default=256)
    p.add_argument("--device_batch_size", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--vocab_size", type=int, default=2048)
    p.add_argument("--docs_per_shard", type=int, default=1000)
    return p.parse_args(argv)


def head_worker(nanochat: Path, argv: list[str]) -> None:
    """HEAD's scripts/base_train.py in this process, unchanged but eager."""
    import torch

    sys.path[:0] = [str(nanochat)]
    try:
        import wandb  # noqa: F401
    except ImportError:  # HEAD imports it; the run is "dummy" and never calls it
        sys.modules["wandb"] = types.ModuleType("wandb")
    # eager: the model's torch.compile and the optimizer kernels' @torch.compile(...) both become the identity
    torch.compile = lambda model=None, **kwargs: model if model is not None else (lambda fn: fn)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # HEAD makes a group on CUDA only: gloo here, see the docstring
        import torch.distributed as dist

        for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"):
            setattr(dist, name, _completed(getattr(dist, name)))
        dist.init_process_group("gloo")
    sys.argv = ["base_train.py", *argv]
    os.chdir(nanochat)
    runpy.run_path(str(nanochat / "scripts" / "base_train.py"), run_name="__main__")


class _Done:
    """A finished collective's work: gloo's CPU works have no futures, HEAD's MuonAdamW asks each for one."""

    def __init__(self, tensor):
        self.tensor = tensor

    def get_future(self):
        import torch

        future = torch.futures.Future()
        future.set_result(self.tensor)
        return future


def _completed(collective):
    """`collective` run to completion when HEAD asks for async_op, its work handed back finished (`_Done`)."""

    def run(output, *args, async_op=False, **kwargs):
        collective(output, *args, **kwargs)
        return _Done(output) if async_op else None

    return run


def head_missing(nanochat: Path) -> str | None:
    """Why HEAD cannot run here (one line), or None."""
    if not (nanochat / "scripts" / "base_train.py").is_file():
        return f"no nanochat checkout at {nanochat} (--nanochat DIR or $NANOCHAT_DIR): HEAD not measured"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "HEAD's tokenizer needs tiktoken (pip install tiktoken): HEAD not measured"
    return None


def prepare(args: argparse.Namespace, tmp: Path, with_head: bool) -> tuple[Path, Path]:
    """Shards and a tokenizer in HEAD's layout under tmp (NANOCHAT_BASE_DIR): base_data_climbmix/, tokenizer/
    (tokenizer.pkl, token_bytes.pt), and the same tokenizer's HF files for ours."""
    import datasets

    from nanochat_hf.data.pretraining import find_shards, split_shards, write_synthetic_shards
    from nanochat_hf.tokenizer import train_tokenizer
    from nanochat_hf.tokenizer.nanochat_format import save_nanochat_tokenizer

    data = tmp / "base_data_climbmix"
    write_synthetic_shards(data, 3, args.docs_per_shard, row_group_size=max(1, args.docs_per_shard // 8))
    texts = datasets.load_dataset("parquet", data_files=split_shards(find_shards(data), "train"), split="train")
    tokenizer = train_tokenizer(texts["text"], args.vocab_size)
    tokenizer.save_pretrained(tmp / "hf_tokenizer")
    if with_head:
        save_nanochat_tokenizer(tokenizer, tmp / "tokenizer")
    return data, tmp / "hf_tokenizer"


def knobs(args: argparse.Namespace, world: int) -> dict[str, object]:
    """HEAD's flags (hyphens for HEAD, underscores for ours): the same model, batch, steps and evaluation."""
    total = args.device_batch_size * args.max_seq_len * world * args.grad_accum
    return {
        "depth": args.depth,
        "aspect_ratio": args.aspect_ratio,
        "head_dim": args.head_dim,
        "max_seq_len": args.max_seq_len,
        "window_pattern": "L",
        "device_batch_size": args.device_batch_size,
        "total_batch_size": total,
        "num_iterations": args.steps,
        "warmup_steps": 2,
        "eval_every": args.steps * 10,  # only at step 0 and after the last step
        "eval_tokens": args.device_batch_size * args.max_seq_len * world,
        "core_metric_every": -1,
        "sample_every": -1,
    }


def launcher(world: int) -> list[str]:
    if world == 1:
        return [sys.executable]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port", str(port)]


def command(args: argparse.Namespace, who: str, row: str, tmp: Path, data: Path, tok: Path, run: int) -> list[str]:
    _, world, extra = ROWS[row]
    flags = knobs(args, world)
    if who == "head":
        argv = ["--device-type=cpu", *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items()), f"--model-tag=r{run}"]
        return [*launcher(world), str(Path(__file__).resolve()), "--head_worker", str(args.nanochat), *argv]
    argv = [f"--{k}={v}" for k, v in flags.items()]
    argv += ["--torch_compile=false", "--num_threads=1", "--disable_tqdm=true", "--data_dir", str(data)]
    argv += ["--tokenizer_dir", str(tok), "--output_dir", str(tmp / f"ours-{row}-{run}")]
    argv += [*(f"{e}=true" for e in extra)]
    return [*launcher(world), str(ROOT / "scripts" / "base_train.py"), *argv]


def measure(cmd: list[str], env: dict, warmup: int, tokens: int) -> dict:
    """Run `cmd`, timestamping each step line as it arrives; tok/s over the steady steps (see the docstring)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    arrivals, printed, tail = [], [], []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        m = STEP.match(line)
        if m:
            arrivals.append(time.perf_counter())
            printed.append(float(m.group(3)) / 1000)
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}:\n{''.join(tail)}")
    steady = [b - a for a, b in zip(arrivals[warmup:-2], arrivals[warmup + 1 : -1])]  # the last line: eval after it
    if not steady:
        raise RuntimeError(f"{len(arrivals)} step lines: too few steps after --warmup {warmup}")
    return {
        "tok_s": tokens / statistics.median(steady),
        "printed_tok_s": tokens / statistics.median(printed[warmup + 1 : -1]),
        "steps": len(steady),
    }


def summarize(results: dict, rows: list[str], with_head: bool) -> list[list[str]]:
    """Table rows, HEAD's run first and ours at its process count after it: the median tok/s over the rounds and, for
    ours, the median and range of the per-round ratios to HEAD's run of the same round."""
    table = []
    for world in dict.fromkeys(ROWS[r][1] for r in rows):
        head = results.get(("head", f"w{world}"))
        if head:
            table.append([f"W={world}", "HEAD base_train.py", *_speeds(head), "1.000", ""])
        for row in (r for r in rows if ROWS[r][1] == world):
            ours = results[("ours", row)]
            line = [ROWS[row][0], "ours base_train.py", *_speeds(ours)]
            if head:
                ratios = [o["tok_s"] / h["tok_s"] for o, h in zip(ours, head)]
                line += [f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}-{max(ratios):.3f}"]
            else:
                line += ["n/a", ""]
            table.append(line)
    return table


def _speeds(runs: list[dict]) -> list[str]:
    return [f"{statistics.median(r[k] for r in runs):,.0f}" for k in ("tok_s", "printed_tok_s")]


def print_table(table: list[list[str]], args: argparse.Namespace) -> None:
    print(f"\n| processes | loop | tok/s | tok/s as printed | / HEAD (median of {args.repeats}) | / HEAD min-max |")
    print("|---|---|---|---|---|---|")
    for line in table:
        print("| " + " | ".join(line) + " |")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--head_worker"]:  # internal: `--head_worker NANOCHAT_DIR HEAD's flags...` in a fresh process
        return head_worker(Path(argv[1]), argv[2:])
    args = parse(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        sys.exit(f"base_train_speed: error: --rows {args.rows!r}: expected some of {','.join(ROWS)}")
    why = "--no_head" if args.no_head else head_missing(args.nanochat)
    with_head = why is None
    if not with_head:
        print(f"base_train_speed: {why}" if why != "--no_head" else "base_train_speed: --no_head: HEAD not measured")
    load = os.getloadavg()
    print(
        f"base_train_speed: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"1 thread per process, float32, eager"
    )
    with tempfile.TemporaryDirectory(prefix="base_train_speed-") as tmp:
        tmp = Path(tmp)
        data, tok = prepare(args, tmp, with_head)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        env.update(NANOCHAT_BASE_DIR=str(tmp), NANOCHAT_DTYPE="float32")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
        runs = []  # HEAD's run at a process count, then ours at it: each ratio pairs neighbours
        for world in dict.fromkeys(ROWS[r][1] for r in rows):
            runs += [("head", f"w{world}")] if with_head else []
            runs += [("ours", r) for r in rows if ROWS[r][1] == world]
        results: dict = {run: [] for run in runs}
        for i in range(args.repeats):
            for who, row in runs if i % 2 == 0 else runs[::-1]:
                world = ROWS[row][1]
                tokens = knobs(args, world)["total_batch_size"]
                result = measure(command(args, who, row, tmp, data, tok, i), env, args.warmup, tokens)
                results[(who, row)].append(result)
                label = ROWS[row][0] if who == "ours" else f"W={world}"
                print(f"round {i + 1}: {who} {label}: {result['tok_s']:,.0f} tok/s", flush=True)
    k = knobs(args, 1)
    print(
        f"\nmodel: depth {args.depth}, aspect ratio {args.aspect_ratio}, head dim {args.head_dim}, vocab "
        f"{args.vocab_size}; {args.device_batch_size} x {args.max_seq_len} tokens x processes x {args.grad_accum} "
        f"accumulation per step; {args.steps} steps, {args.warmup} warm-up steps left out; "
        f"{k['total_batch_size']:,} tokens per step at W=1; load after: {os.getloadavg()[0]:.1f}"
    )
    print_table(summarize(results, rows, with_head), args)


if __name__ == "__main__":
    main()
