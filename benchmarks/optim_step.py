"""Median time of one Muon step over the block matrices of a nanochat model: ours vs torch.optim.Muon.

    python benchmarks/optim_step.py            # d12 on CPU, d20 (and d12) when CUDA is available
    python benchmarks/optim_step.py --quick    # small smoke run

Both optimizers get identical float32 parameters and gradients and the same math (Nesterov momentum 0.95,
5 bf16 Newton-Schulz steps, lr * max(1, rows/cols)^0.5, no weight decay); torch's loops over the matrices one
at a time, ours runs one batched Newton-Schulz per shape. The bf16 matmul rate of the machine is measured in the
same run with plain batched matmuls of exactly the shapes Newton-Schulz multiplies, and the table reports which
fraction of it our step reaches (Newton-Schulz FLOPs / our step time / matmul rate).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from nanochat_hf.optim import MuonAdamW


def block_shapes(depth: int) -> list[tuple[int, int]]:
    """Shapes of every transformer.h matrix of a nanochat d<depth> model (n_embd = 64*depth, n_kv_head = n_head)."""
    d = 64 * depth
    return [(d, d), (d, d), (d, d), (d, d), (4 * d, d), (d, 4 * d)] * depth


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


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


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


def bench(depth: int, repeats: int, device: torch.device) -> dict[str, float]:
    shapes = block_shapes(depth)
    torch.manual_seed(0)
    grads = [torch.randn(s, device=device) for s in shapes]

    def params():
        ps = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
        for p, g in zip(ps, grads):
            p.grad = g
        return ps

    ours = MuonAdamW([{"params": params(), "kind": "muon", "name": "muon/matrix", "lr": 0.02, "initial_lr": 0.02,
                       "momentum": 0.95, "nesterov": True, "ns_steps": 5}], sharded=False)
    ref = torch.optim.Muon(params(), lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5,
                           adjust_lr_fn="original")
    mm = matmuls(shapes, device)
    fns = {"ours": ours.step, "torch": ref.step, "mm": mm}
    for fn in fns.values():  # warm-up: allocations, kernels, optimizer state
        fn()
    # interleaved, so that a change in load on shared cores hits all three alike
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(timed(fn, device))
    t_ours, t_ref, t_mm = (statistics.median(times[k]) for k in fns)
    rate = ns_flops(shapes, steps=1) / t_mm
    flops = ns_flops(shapes)
    return {"depth": depth, "matrices": len(shapes), "tflop": flops / 1e12, "ours": t_ours, "torch": t_ref,
            "ours_rate": flops / t_ours, "matmul_rate": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="d2 and 2 repeats: a smoke run")
    parser.add_argument("--depth", type=int, nargs="*", help="model depths (default: 12, plus 20 on CUDA)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    depths = args.depth or ([2] if args.quick else [12, 20] if device.type == "cuda" else [12])
    repeats = 2 if args.quick else args.repeats
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}; median of {repeats} interleaved steps after one warm-up")
    if hasattr(os, "getloadavg"):
        print(f"load average before: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    header = (f"{'model':>5} {'mats':>4} {'NS TFLOP':>8} {'ours s':>9} {'torch s':>9} {'ours/torch':>10} "
              f"{'ours TFLOP/s':>12} {'bf16 mm TFLOP/s':>15} {'of mm rate':>10}")
    print(header)
    print("-" * len(header))
    for depth in depths:
        r = bench(depth, repeats, device)
        print(f"{'d' + str(r['depth']):>5} {r['matrices']:>4} {r['tflop']:>8.3f} {r['ours']:>9.4f} "
              f"{r['torch']:>9.4f} {r['ours'] / r['torch']:>10.2f} {r['ours_rate'] / 1e12:>12.3f} "
              f"{r['matmul_rate'] / 1e12:>15.3f} {r['ours_rate'] / r['matmul_rate']:>10.0%}")
    if hasattr(os, "getloadavg"):
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
