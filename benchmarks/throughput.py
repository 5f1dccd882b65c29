"""Training throughput, compile time, memory: MidTrainer against nanochat's loop, eager and compiled, 1 and 2 processes.

    python benchmarks/throughput.py                                   # demo shape, CPU, every arm, 3 rounds (~20 min)
    python benchmarks/throughput.py --compile eager --processes 2     # a subset of the arms (~4 min)
    python benchmarks/throughput.py --compile eager --processes 2 --fsdp2   # both loops on FSDP2 (fully_shard)
    python benchmarks/throughput.py --depth 20 --vocab 65536 --seq 2048 --batch 32 --grad_accum 1 --processes 1
                                                                      # d20 on one GPU (bf16 autocast)

Arms: {MidTrainer, baseline} x {eager, compiled} x {1, 2 processes}. The baseline is nanochat's mid-training loop
written plainly on our model class and optimizer: per step, grad_accum forward/backward passes of loss / grad_accum
under bf16 autocast on CUDA (embedding weights in bf16 there, as nanochat), the LR multiplier and Muon momentum set,
the optimizer step, zero_grad, the last loss read back; `torch.compile(model, dynamic=False)` when compiled, no DDP
(the sharded optimizer reduces gradients).
Every arm runs in a fresh process (or a fresh pair, launched with `accelerate launch --multi_gpu` as the tests do:
gloo on CPU, NCCL on CUDA), 1 torch thread per process on CPU, on random tokens; `--grad_accum` is for 1 process and
is divided by the process count, so every arm trains the same tokens per optimizer step. On CPU both loops run with
glibc keeping freed memory for the next step (`reuse_freed_memory`, what MidTrainer sets on CPU); prefix the command
with `GLIBC_TUNABLES=` (an empty setting: the environment's choice, which it leaves alone) for glibc's defaults.
Each arm runs `--repeats` times, the two loops back to back in every round (each loop first in every other round),
so that a ratio compares runs that saw the same load on a shared machine. Columns:
- runs: how many runs of the arm.
- tok/s: tokens per second of all processes over the steps after the first `--warmup`, of the median run (by mean
  step time); "tok/s min-max": the slowest and the fastest run.
- / base: the median, over the rounds, of the arm's tok/s divided by the baseline's of the same round (same compile
  mode and process count); "/ base min-max": the lowest and highest of those ratios.
- compile s: how much longer the first `--warmup` steps took compiled than eager (same loop and process count,
  median runs).
- peak MiB/rank: the highest RSS high-water mark of the ranks on CPU over the runs (the whole process: Python, torch,
  model, activations, compiler), `torch.cuda.max_memory_allocated` on CUDA; "/ base" against the baseline's.
- opt MiB/rank: optimizer state bytes of the largest rank (the sharded step keeps each rank's share only).
- MFU: FLOPs per token (nanochat's estimate: 6 x non-embedding params + 12 x layers x heads x head_dim x seq)
  x tok/s over the peak of all processes (bf16 dense TFLOPS from the GPU's name, or `--peak_tflops`).
Then, per loop and process count, the time a whole run of `--run_steps` steps would take eager and compiled
(first steps as measured, the rest at the measured rate): whether compiling pays for itself.
Compilation starts from an empty inductor cache in every arm, as a first run on a fresh machine does
(`--warm_cache`: the user's cache, as later runs do).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data import MicroBatchStream
from nanochat_hf.integration.momentum import muon_momentum
from nanochat_hf.optim import build_optimizer
from nanochat_hf.training.arguments import parse_args
from nanochat_hf.training.callbacks import PEAK_FLOPS
from nanochat_hf.training.device import reuse_freed_memory
from nanochat_hf.training.run import fully_shard_blocks
from nanochat_hf.training.trainer import MidTrainer

LOOPS = {"midtrainer": "MidTrainer", "baseline": "nanochat loop"}
FSDP2_ENV = "NANOCHAT_HF_THROUGHPUT_FSDP2"  # --fsdp2, as the arms' processes see it
MiB = 2**20


class RandomStream(MicroBatchStream):
    """`count` random micro-batches of (B, T+1) tokens (4 distinct ones, repeated)."""

    def __init__(self, vocab: int, batch: int, seq: int, count: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.batches = [torch.randint(0, vocab, (batch, seq + 1), generator=g) for _ in range(4)]
        self.count = count

    def num_micro_batches(self) -> int:
        return self.count

    def epoch_steps(self, grad_accum: int) -> int:
        return self.count // grad_accum

    def lr_progress(self, step: int, grad_accum: int) -> float:
        return step / self.epoch_steps(grad_accum)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return

    def read(self, count: int | None = None):
        for i in itertools.count() if count is None else range(count):
            x = self.batches[i % len(self.batches)]
            yield {"input_ids": x, "labels": x}


# ---- one arm, in its own process (one rank of it) ------------------------------------------------------------
def build_model(a, device: torch.device) -> NanoChatGPTForCausalLM:
    torch.manual_seed(0)
    cfg = NanoChatGPTConfig.from_depth(a.depth, vocab_size=a.vocab, sequence_len=a.seq)
    return NanoChatGPTForCausalLM(cfg).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def baseline_loop(a, device: torch.device, bf16: bool, world: int, rank: int) -> dict:
    """nanochat's mid_train step on our model and optimizer; returns the step end times (first: the start)."""
    if device.type == "cpu":  # glibc keeps freed memory for the next step, as MidTrainer has it on CPU
        reuse_freed_memory()
    model = build_model(a, device)
    if a.fsdp2:  # each block and the root, as mid_train --fully_shard does (the embedding stays float32: one dtype)
        fully_shard_blocks(model)
    elif device.type == "cuda":  # nanochat keeps the embedding in bf16 on CUDA
        model.transformer.wte.to(dtype=torch.bfloat16)
    opt = build_optimizer(model)  # sharded when the process group has several ranks; FSDP2's step on DTensors
    if a.compiled:
        model = torch.compile(model, dynamic=False)
    ga = a.grad_accum // world
    stream = RandomStream(a.vocab, a.batch, a.seq, a.steps * ga, seed=rank).read()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times = []
    _sync(device)
    times.append(time.perf_counter())
    for step in range(a.steps):
        for _ in range(ga):
            x = next(stream)["input_ids"].to(device, non_blocking=True)
            with autocast:
                loss = model(input_ids=x, labels=x).loss
            (loss / ga).backward()
        progress = (step + 1) / a.steps
        lrm = 1.0 if progress < 0.8 else 1 - (progress - 0.8) / 0.2
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        opt.set_muon_momentum(muon_momentum(step))
        opt.step()
        model.zero_grad(set_to_none=True)
        loss.item()  # nanochat logs the loss every step: a device sync
        _sync(device)
        times.append(time.perf_counter())
    flops = getattr(model, "_orig_mod", model).num_flops_per_token()
    return {"times": times, "optimizer": opt, "flops_per_token": flops}


class _StepTimes(TrainerCallback):
    def __init__(self, device: torch.device):
        self.device, self.times = device, []

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.times:
            _sync(self.device)
            self.times.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        _sync(self.device)
        self.times.append(time.perf_counter())


class _BenchTrainer(MidTrainer):
    def make_stream(self, token_ds):
        a = self.bench
        return RandomStream(
            a.vocab,
            a.batch,
            a.seq,
            a.steps * self.args.gradient_accumulation_steps,
            seed=self.accelerator.process_index,
        )


def trainer_loop(a, device: torch.device, bf16: bool, world: int, rank: int) -> dict:
    model = build_model(a, device)
    args = parse_args(
        [  # writes nothing (no saves), but the Trainer wants an output_dir: beside the results
            "--model_source",
            "benchmark",
            "--output_dir",
            f"{a.result}-out",
            "--max_seq_len",
            str(a.seq),
            "--device_batch_size",
            str(a.batch),
            "--total_batch_size",
            str(a.batch * a.seq * a.grad_accum),
            "--num_iterations",
            str(a.steps),
            "--eval_every",
            "0",
            "--save_steps",
            "0",
            "--dtype",
            "bfloat16" if bf16 else "float32",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--torch_compile",
            str(a.compiled).lower(),
            "--num_threads",
            str(torch.get_num_threads()),
            "--fully_shard",
            str(a.fsdp2).lower(),
        ]
    )
    if a.fsdp2:  # what run.build_trainer does before it builds the trainer
        _ = args.device  # Accelerate's process group
        fully_shard_blocks(model)
    _BenchTrainer.bench = a
    timer = _StepTimes(device)
    trainer = _BenchTrainer(
        model=model,
        args=args,
        train_dataset=[0],
        eval_dataset=None,
        token_bytes=torch.ones(a.vocab, dtype=torch.long),
        callbacks=[timer],
    )
    with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines
        trainer.train()
    return {"times": timer.times, "optimizer": trainer.optimizer, "flops_per_token": model.num_flops_per_token()}


def state_bytes(optimizer) -> int:
    """Bytes of the tensors in this rank's optimizer state."""
    opt = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return None


def worker(a) -> None:
    """One rank of one arm: run it, write this rank's measurements to `{a.result}.rank{r}.json`."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    a.fsdp2 = os.environ.get(FSDP2_ENV) == "1"
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    bf16 = a.dtype == "bfloat16" or (a.dtype == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    if a.worker == "baseline" and world > 1:  # nanochat initialises the group itself; MidTrainer's Accelerate does
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    run = (baseline_loop if a.worker == "baseline" else trainer_loop)(a, device, bf16, world, rank)
    times = run["times"]
    if a.fsdp2 and getattr(run["optimizer"], "optimizer", run["optimizer"]).fsdp_mesh is None:
        raise RuntimeError(f"{a.worker}: --fsdp2, but the optimizer did not take the FSDP2 step")
    if len(times) != a.steps + 1:
        raise RuntimeError(f"{a.worker}: timed {len(times) - 1} steps, expected {a.steps}")
    peak = (
        torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )  # Linux: KiB
    result = {
        "warmup_s": times[a.warmup] - times[0],
        "steady_step_s": (times[-1] - times[a.warmup]) / (a.steps - a.warmup),
        "tokens_per_step": a.batch * a.seq * a.grad_accum,
        "peak_bytes": peak,
        "optimizer_bytes": state_bytes(run["optimizer"]),
        "flops_per_token": run["flops_per_token"],
        "peak_flops": peak_flops(device, a.peak_tflops),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "precision": "bf16 autocast" if bf16 else "fp32",
        "world": world,
    }
    Path(f"{a.result}.rank{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------------------------
def run_arm(a, loop: str, compiled: bool, nproc: int, workdir: Path, port: int) -> dict:
    """Launch one arm in fresh process(es), return its measurements (rank 0's times, the largest rank's memory)."""
    result = workdir / f"{loop}-{'compiled' if compiled else 'eager'}-{nproc}"
    shape = [
        "--depth",
        str(a.depth),
        "--vocab",
        str(a.vocab),
        "--seq",
        str(a.seq),
        "--batch",
        str(a.batch),
        "--grad_accum",
        str(a.grad_accum),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--dtype",
        a.dtype,
        *(["--peak_tflops", str(a.peak_tflops)] if a.peak_tflops else []),
    ]
    script = [
        str(Path(__file__).resolve()),
        *shape,
        "--worker",
        loop,
        "--result",
        str(result),
        *(["--compiled"] if compiled else []),
    ]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(nproc),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(port),
            *script,
        ]
    else:
        cmd = [sys.executable, *script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not a.warm_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / f"inductor-{result.name}")
        env["TRITON_CACHE_DIR"] = str(workdir / f"triton-{result.name}")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"arm {result.name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return collect(result, loop, compiled, nproc)


def collect(result: Path, loop: str, compiled: bool, nproc: int) -> dict:
    """One run's row from the ranks' result files."""
    ranks = [json.loads(Path(f"{result}.rank{r}.json").read_text()) for r in range(nproc)]
    row = dict(
        ranks[0],
        loop=loop,
        compiled=compiled,
        processes=nproc,
        peak_bytes=max(r["peak_bytes"] for r in ranks),
        optimizer_bytes=max(r["optimizer_bytes"] for r in ranks),
    )
    row["tok_s"] = row["tokens_per_step"] / row["steady_step_s"]
    return row


def summarize(runs: list[dict]) -> list[dict]:
    """One row per arm from its runs: the median step time (and so tok/s), its range, and against the baseline
    the median and range of the ratios of runs made back to back (run i of each loop of the same compile mode and
    process count: the pair saw the same load)."""
    by_arm: dict[tuple, list[dict]] = {}
    for r in runs:
        by_arm.setdefault((r["loop"], r["compiled"], r["processes"]), []).append(r)
    rows = []
    for (loop, compiled, nproc), arm in by_arm.items():
        row = dict(
            arm[0],
            runs=len(arm),
            steady_step_s=statistics.median(r["steady_step_s"] for r in arm),
            warmup_s=statistics.median(r["warmup_s"] for r in arm),
            peak_bytes=max(r["peak_bytes"] for r in arm),
            tok_s_range=(min(r["tok_s"] for r in arm), max(r["tok_s"] for r in arm)),
        )
        row["tok_s"] = row["tokens_per_step"] / row["steady_step_s"]
        row["mfu"] = row["flops_per_token"] * row["tok_s"] / (row["peak_flops"] * nproc) if row["peak_flops"] else None
        base = by_arm.get(("baseline", compiled, nproc))
        row["ratios"] = [r["tok_s"] / b["tok_s"] for r, b in zip(arm, base)] if base else []
        row["base_peak_bytes"] = max(r["peak_bytes"] for r in base) if base else None
        rows.append(row)
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_tables(a, runs: list[dict]) -> None:
    rows = summarize(runs)
    first = rows[0]
    print(
        f"device: {first['device']}, {first['precision']}; depth {a.depth} (NanoChatGPTConfig.from_depth), vocab "
        f"{a.vocab}; {a.batch} x {a.seq} tokens x grad_accum {a.grad_accum} per optimizer step (divided among the "
        f"processes); {a.steps} steps, the first {a.warmup} untimed; "
        f"{'1 torch thread per process' if first['device'] == 'CPU' else 'one GPU per process'}; "
        f"the loops' runs interleaved, {a.repeats} of each arm"
    )
    by_key = {(r["loop"], r["compiled"], r["processes"]): r for r in rows}
    print(
        "| loop | compile | processes | runs | tok/s | tok/s min-max | / base | / base min-max | compile s "
        "| peak MiB/rank | / base | opt MiB/rank | MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eager = by_key.get((r["loop"], False, r["processes"]))
        compile_s = r["warmup_s"] - eager["warmup_s"] if r["compiled"] and eager else None
        ratios, base_peak = r["ratios"], r["base_peak_bytes"]
        print(
            f"| {LOOPS[r['loop']]} | {'compiled' if r['compiled'] else 'eager'} | {r['processes']} | {r['runs']} "
            f"| {r['tok_s']:,.0f} | {r['tok_s_range'][0]:,.0f}-{r['tok_s_range'][1]:,.0f} "
            f"| {_fmt(statistics.median(ratios) if ratios else None, '.2f')} "
            f"| {f'{min(ratios):.2f}-{max(ratios):.2f}' if ratios else 'n/a'} | {_fmt(compile_s, '.1f')} "
            f"| {r['peak_bytes'] / MiB:,.0f} | {_fmt(base_peak and r['peak_bytes'] / base_peak, '.2f')} "
            f"| {r['optimizer_bytes'] / MiB:,.1f} | {_fmt(r['mfu'] and 100 * r['mfu'], '.1f')}"
            f"{'%' if r['mfu'] else ''} |"
        )
    pairs = [
        (by_key[(loop, False, n)], by_key[(loop, True, n)])
        for loop, c, n in by_key
        if not c and (loop, True, n) in by_key
    ]
    if pairs:
        print(f"\nA run of {a.run_steps} steps (first {a.warmup} as measured, the rest at the measured rate):")
        for eager, comp in pairs:
            t_e, t_c = (r["warmup_s"] + (a.run_steps - a.warmup) * r["steady_step_s"] for r in (eager, comp))
            print(
                f"- {LOOPS[eager['loop']]}, {eager['processes']} process(es): eager {t_e:,.0f} s, compiled "
                f"{t_c:,.0f} s: compiling {'wins' if t_c < t_e else 'loses'} ({t_e / t_c:.2f}x)"
            )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=2, help="micro-batches per step with 1 process")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3, help="first steps not timed (compilation happens there)")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="auto: bf16 autocast on CUDA, fp32 on CPU (as mid_train)",
    )
    p.add_argument("--loops", nargs="+", choices=list(LOOPS), default=list(LOOPS))
    p.add_argument("--compile", choices=["eager", "compiled", "both"], default="both")
    p.add_argument("--processes", nargs="+", type=int, default=[1, 2])
    p.add_argument("--peak_tflops", type=float, default=None, help="per device, for MFU (default: from the GPU name)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm, the loops' runs interleaved")
    p.add_argument("--run_steps", type=int, default=211, help="whole-run length for the compile verdict (demo: 211)")
    p.add_argument("--warm_cache", action="store_true", help="compile with the user's inductor cache")
    p.add_argument(
        "--fsdp2",
        action="store_true",
        help="both loops on FSDP2: fully_shard on each block and the root (mid_train's --fully_shard), needs "
        "--processes of 2 or more",
    )
    p.add_argument("--worker", choices=list(LOOPS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats must be at least 1, got {a.repeats}")
    if not 0 < a.warmup < a.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {a.warmup}")
    bad = [] if a.worker else [n for n in a.processes if n < 1 or a.grad_accum % n]
    if bad:
        p.error(f"--processes {bad}: every process count must divide --grad_accum {a.grad_accum}")
    if a.fsdp2 and not a.worker:
        if min(a.processes) < 2:
            p.error(f"--fsdp2 --processes {a.processes}: FSDP2 shards across processes, every count must be 2 or more")
        os.environ[FSDP2_ENV] = "1"  # to the arms' processes in their environment (run_arm passes os.environ on)
    gpus = torch.cuda.device_count()
    if not a.worker and gpus and max(a.processes) > gpus:
        p.error(f"--processes {max(a.processes)}: only {gpus} GPU(s) visible, one process per GPU")
    return a


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse(argv)
    if a.worker:
        worker(a)
        return []
    modes = {"eager": [False], "compiled": [True], "both": [False, True]}[a.compile]
    rows = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        port = 29500 + os.getpid() % 1000
        for repeat in range(a.repeats):  # the two loops back to back, each first in every other round
            (Path(tmp) / str(repeat)).mkdir()
            loops = [loop for loop in ("baseline", "midtrainer") if loop in a.loops][:: 1 if repeat % 2 == 0 else -1]
            for nproc in a.processes:
                for compiled in modes:
                    for loop in loops:
                        run = run_arm(a, loop, compiled, nproc, Path(tmp) / str(repeat), port + len(rows))
                        rows.append(run)
    print_tables(a, rows)
    return rows


if __name__ == "__main__":
    main()
