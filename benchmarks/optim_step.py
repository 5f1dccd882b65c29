"""Median time of one Muon step over the block matrices of a nanochat model: ours vs torch.optim.Muon.

    python benchmarks/optim_step.py            # d12 on CPU, d20 (and d12) when CUDA is available
    python benchmarks/optim_step.py --quick    # small smoke run

Every optimizer gets the same float32 parameters and gradients and the same math (Nesterov momentum 0.95,
5 bf16 Newton-Schulz steps, lr * max(1, rows/cols)^0.5, no weight decay). torch's loops over the matrices one
at a time; ours runs Newton-Schulz batched over each shape or one matrix at a time (the default picks by device
and shape, marked "*"), and optionally with the Gram iteration for rectangular matrices. The bf16 matmul rate of
the machine is measured in the same run with plain batched matmuls of exactly the shapes Newton-Schulz
multiplies, and the table reports which fraction of it each step reaches (standard Newton-Schulz FLOPs / step
time / matmul rate). Then: the Gram iteration's speed and deviation on the rectangular shapes, and the optimizer
state per rank for 1 and 2 processes of the sharded step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.optim import MuonAdamW, newton_schulz, ns_batch_size, state_bytes_per_rank


def model_shapes(depth: int, vocab: int = 65536) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Shapes of the Muon matrices (every transformer.h matrix) and of the AdamW ones (wte, lm_head) of a nanochat
    d<depth> model, read from the model itself built on the meta device (no memory)."""
    with torch.device("meta"):
        model = NanoChatGPTForCausalLM(NanoChatGPTConfig.from_depth(depth, vocab_size=vocab))
    block = [tuple(p.shape) for p in model.transformer.h.parameters()]
    return block, [tuple(model.lm_head.weight.shape), tuple(model.transformer.wte.weight.shape)]


def ns_flops(shapes: list[tuple[int, int]], steps: int = 5) -> float:
    """Matmul FLOPs of Newton-Schulz: per step X X^T (2 m^2 n), A A (2 m^3), B X (2 m^2 n), m <= n."""
    total = 0.0
    for r, c in shapes:
        m, n = min(r, c), max(r, c)
        total += steps * (4 * m * m * n + 2 * m**3)
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved(fns: dict, repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each function, after one warm-up call each, the functions alternating in every round so
    that a change in load on shared cores hits all of them alike."""
    for fn in fns.values():  # warm-up: allocations, kernels, optimizer state
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def matmuls(shapes: list[tuple[int, int]], device: torch.device):
    """Plain bf16 batched matmuls with exactly Newton-Schulz's shapes (one iteration's three products)."""
    buckets: dict[tuple[int, int], int] = {}
    for r, c in shapes:
        key = (min(r, c), max(r, c))
        buckets[key] = buckets.get(key, 0) + 1
    xs = {k: torch.randn(b, *k, device=device, dtype=torch.bfloat16) for k, b in buckets.items()}
    grams = {k: torch.randn(b, k[0], k[0], device=device, dtype=torch.bfloat16) for k, b in buckets.items()}

    def run():
        for k, x in xs.items():
            torch.bmm(x, x.mT)
            torch.bmm(grams[k], grams[k])
            torch.bmm(grams[k], x)

    return run


def bench_step(depth: int, repeats: int, device: torch.device) -> None:
    shapes = model_shapes(depth)[0]
    torch.manual_seed(0)
    # one set of parameters for every optimizer: the step's cost does not depend on the values, and the memory
    # of a d20 model's matrices is then held once
    params = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device)

    def ours(**ns):
        group = {"params": params, "kind": "muon", "name": "muon/matrix", "lr": 0.02, "initial_lr": 0.02,
                 "momentum": 0.95, "nesterov": True, "ns_steps": 5, **ns}
        return MuonAdamW([group], sharded=False).step

    default = "batched" if ns_batch_size(device, shapes[0]) == 0 else "per matrix"
    fns = {"ours, batched": ours(ns_batch_size=0), "ours, per matrix": ours(ns_batch_size=1),
           "ours, Gram (default batching)": ours(ns_gram=True),
           "torch.optim.Muon": torch.optim.Muon(params, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True,
                                                ns_steps=5, adjust_lr_fn="original").step,
           "bf16 matmuls": matmuls(shapes, device)}
    t = interleaved(fns, repeats, device)
    rate = ns_flops(shapes, steps=1) / t["bf16 matmuls"]
    flops = ns_flops(shapes)
    print(f"\nd{depth}: {len(shapes)} matrices, {flops / 1e12:.3f} TFLOP of standard Newton-Schulz per step; "
          f"bf16 matmul rate {rate / 1e12:.3f} TFLOP/s; default path here: {default}")
    header = f"{'optimizer step':<32} {'s':>9} {'/ torch':>8} {'TFLOP/s':>8} {'of mm rate':>10}"
    print(header + "\n" + "-" * len(header))
    for name, sec in t.items():
        if name == "bf16 matmuls":
            continue
        mark = "*" if name == f"ours, {default}" else ""
        print(f"{name + mark:<32} {sec:>9.4f} {sec / t['torch.optim.Muon']:>8.2f} {flops / sec / 1e12:>8.3f} "
              f"{flops / sec / rate:>10.0%}")


def bench_gram(depth: int, repeats: int, device: torch.device) -> None:
    """Speed and deviation of the Gram iteration on the model's rectangular matrices (default batching)."""
    shapes = [s for s in model_shapes(depth)[0] if s[0] != s[1]]
    torch.manual_seed(1)
    rect = {s: torch.randn(shapes.count(s), *s, device=device) for s in dict.fromkeys(shapes)}

    def run(gram):
        return lambda: [newton_schulz(g, gram=gram) for g in rect.values()]

    t = interleaved({"standard": run(False), "gram": run(True)}, repeats, device)
    print(f"\nGram Newton-Schulz on the {len(shapes)} rectangular matrices of d{depth}: "
          f"standard {t['standard']:.4f} s, Gram {t['gram']:.4f} s, speedup {t['standard'] / t['gram']:.2f}x")
    header = f"{'shape':>12} {'dtype':>9} {'max |gram-std|':>15} {'rel Frobenius':>14} {'std vs float64':>15}"
    print(header + "\n" + "-" * len(header))
    for shape, g in rect.items():
        exact = newton_schulz(g[:2], dtype=torch.float64)
        for dtype in (torch.bfloat16, torch.float32):
            std = newton_schulz(g[:2], dtype=dtype).double()
            diff = newton_schulz(g[:2], gram=True, dtype=dtype).double() - std
            print(f"{str(shape):>12} {str(dtype).removeprefix('torch.'):>9} {diff.abs().max().item():>15.3g} "
                  f"{(diff.norm() / std.norm()).item():>14.3g} {((std - exact).norm() / exact.norm()).item():>15.3g}")


def print_state_bytes(depth: int, vocab: int) -> None:
    block, adamw = model_shapes(depth, vocab)
    print(f"\noptimizer state per rank, d{depth} (vocab {vocab}), from the sharding rule of the sharded step "
          f"(tests/optim/test_distributed.py checks the rule against a 2-process run):")
    for world in (1, 2):
        per_rank = state_bytes_per_rank(block, adamw, world)
        print(f"  {world} process{'es' if world > 1 else ''}: " +
              ", ".join(f"rank {r} {b / 2**20:,.1f} MiB" for r, b in enumerate(per_rank)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="d2 and 2 repeats: a smoke run")
    parser.add_argument("--depth", type=int, nargs="*", help="model depths (default: 12, plus 20 on CUDA)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=65536, help="vocabulary for the state sizes (nanochat's)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    depths = args.depth or ([2] if args.quick else [12, 20] if device.type == "cuda" else [12])
    repeats = 2 if args.quick else args.repeats
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}; median of {repeats} interleaved runs after one warm-up")
    if hasattr(os, "getloadavg"):
        print(f"load average before: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    for depth in depths:
        bench_step(depth, repeats, device)
        bench_gram(depth, repeats, device)
        print_state_bytes(depth, args.vocab)
    if hasattr(os, "getloadavg"):
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
