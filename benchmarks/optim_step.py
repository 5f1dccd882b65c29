"""Median time of one Muon step over the block matrices of a nanochat model, both optimizer recipes and both
orthogonalisation dtypes (``polar_dtype``), against torch.optim.Muon, in one interleaved run.

    python benchmarks/optim_step.py                      # the table: d4, d8, d12 on CPU (d12, d20 on CUDA)
    python benchmarks/optim_step.py --emulate_no_bf16    # the same as on a CPU without native bfloat16 (oneDNN off)
    python benchmarks/optim_step.py --quick              # d2, 2 repeats: a smoke run
    python benchmarks/optim_step.py --details            # also the batching paths, the Gram iteration, nanochat's
                                                         # formula (bfloat16: slow where bfloat16 is emulated)

The table (default): for each depth, the step of recipe 2025-12 (`MuonAdamW`: Nesterov momentum, 5 Newton-Schulz
steps), of recipe 2026-07 (`NorMuonAdamW`: Polar Express, NorMuon, one stack per shape) and of torch.optim.Muon
(same math as 2025-12, a matrix at a time), each with the orthogonalisation in bfloat16 and in float32 (torch's
bfloat16 is hard-coded: its float32 row runs torch's own Newton-Schulz function with the bfloat16 cast replaced by a
float32 copy). Same float32 parameters and gradients for all, no weight decay; medians of rounds in which every
step runs once in turn, so that a change of load on shared cores hits all alike. Where bfloat16 is emulated
(40-70x slower than float32) a step can take minutes: a cell whose first call (the warm-up) takes longer than
--budget / --repeats seconds is reported from that one call ("1 call"), and one predicted (from the previous depth's
time x the FLOP ratio) to take longer than --max_call seconds is not run ("est."). So the default run finishes in a
few minutes on a 2-core CPU either way.

--details adds the sections of earlier releases: ours batched / per matrix / Gram vs torch.optim.Muon in bfloat16
with the machine's bf16 matmul rate, the Gram iteration's speed and deviation, and recipe 2026-07's step vs a
transcription of nanochat's `muon_step_fused` (92d63d4, nanochat/optim.py) run eagerly on the same stacks
(orthogonalisation in bfloat16 on CUDA and float32 on CPU, as nanochat's compute dtype). The optimizer state per
rank of both recipes at 1 and 2 processes ends every run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.optim import MuonAdamW, NorMuonAdamW, newton_schulz, ns_batch_size
from nanochat_hf.optim.head import SMALL_NUMEL
from nanochat_hf.optim.kernels import POLAR_EXPRESS_COEFFS
from nanochat_hf.optim.precision import cpu_has_native_bfloat16
from nanochat_hf.training.device import use_cpu_threads


# ---- optimizer state per rank: the sharding rules of the two recipes (tests/optim checks them against 2-process runs)
def state_bytes_per_rank(
    muon_shapes: list[tuple[int, ...]], adamw_shapes: list[tuple[int, ...]], world_size: int
) -> list[int]:
    """Optimizer state bytes each rank holds after a step of recipe 2025-12, from the sharding rule in
    `nanochat_hf.optim.optimizer`'s docstring.

    ``muon_shapes``: the Muon matrices in group order (one float32 momentum buffer each, on the owning rank);
    ``adamw_shapes``: the AdamW parameters (two float32 moments for the rank's ceil(n/W) rows of dim 0).
    """
    per_rank = [0] * world_size
    counts: dict[tuple[int, ...], int] = {}
    for shape in muon_shapes:
        i = counts.get(tuple(shape), 0)
        counts[tuple(shape)] = i + 1
        per_rank[i % world_size] += 4 * torch.Size(shape).numel()
    for shape in adamw_shapes:
        k = -(-shape[0] // world_size)
        row = torch.Size(shape[1:]).numel()
        for r in range(world_size):
            rows = max(0, min(shape[0], (r + 1) * k) - min(shape[0], r * k))
            per_rank[r] += 2 * 4 * rows * row
    return per_rank


def head_state_bytes_per_rank(
    muon_shapes: list[tuple[int, ...]], adamw_shapes: list[tuple[int, ...]], world_size: int
) -> list[int]:
    """Optimizer state bytes each rank holds after a step of recipe 2026-07, from the layout in
    `nanochat_hf.optim.head`'s docstring.

    ``muon_shapes``: every Muon matrix (stacked by shape: k = ceil(K/W) float32 momentum matrices per rank plus the
    factored second moment); ``adamw_shapes``: the AdamW parameters (two float32 moments: whole when smaller than
    SMALL_NUMEL elements, else for the rank's ceil(n/W) rows of dim 0).
    """
    per_rank = [0] * world_size
    counts: dict[tuple[int, ...], int] = {}
    for shape in muon_shapes:
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
    for (rows, cols), n in counts.items():
        k = -(-n // world_size)
        for r in range(world_size):
            per_rank[r] += 4 * k * (rows * cols + max(rows, cols))
    for shape in adamw_shapes:
        numel, row = torch.Size(shape).numel(), torch.Size(shape[1:]).numel()
        k = shape[0] if world_size == 1 or numel < SMALL_NUMEL else -(-shape[0] // world_size)
        for r in range(world_size):
            rows = shape[0] if k == shape[0] else max(0, min(shape[0], (r + 1) * k) - min(shape[0], r * k))
            per_rank[r] += 2 * 4 * rows * row
    return per_rank


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
        group = {
            "params": params,
            "kind": "muon",
            "name": "muon/matrix",
            "lr": 0.02,
            "initial_lr": 0.02,
            "momentum": 0.95,
            "nesterov": True,
            "ns_steps": 5,
            **ns,
        }
        return MuonAdamW([group], sharded=False).step

    default = "batched" if ns_batch_size(device, shapes[0]) == 0 else "per matrix"
    fns = {
        "ours, batched": ours(ns_batch_size=0),
        "ours, per matrix": ours(ns_batch_size=1),
        "ours, Gram (default batching)": ours(ns_gram=True),
        "torch.optim.Muon": torch.optim.Muon(
            params, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original"
        ).step,
        "bf16 matmuls": matmuls(shapes, device),
    }
    t = interleaved(fns, repeats, device)
    rate = ns_flops(shapes, steps=1) / t["bf16 matmuls"]
    flops = ns_flops(shapes)
    print(
        f"\nd{depth}: {len(shapes)} matrices, {flops / 1e12:.3f} TFLOP of standard Newton-Schulz per step; "
        f"bf16 matmul rate {rate / 1e12:.3f} TFLOP/s; default path here: {default}"
    )
    header = f"{'optimizer step':<32} {'s':>9} {'/ torch':>8} {'TFLOP/s':>8} {'of mm rate':>10}"
    print(header + "\n" + "-" * len(header))
    for name, sec in t.items():
        if name == "bf16 matmuls":
            continue
        mark = "*" if name == f"ours, {default}" else ""
        print(
            f"{name + mark:<32} {sec:>9.4f} {sec / t['torch.optim.Muon']:>8.2f} {flops / sec / 1e12:>8.3f} "
            f"{flops / sec / rate:>10.0%}"
        )


def bench_gram(depth: int, repeats: int, device: torch.device) -> None:
    """Speed and deviation of the Gram iteration on the model's rectangular matrices (default batching)."""
    shapes = [s for s in model_shapes(depth)[0] if s[0] != s[1]]
    torch.manual_seed(1)
    rect = {s: torch.randn(shapes.count(s), *s, device=device) for s in dict.fromkeys(shapes)}

    def run(gram):
        return lambda: [newton_schulz(g, gram=gram) for g in rect.values()]

    t = interleaved({"standard": run(False), "gram": run(True)}, repeats, device)
    print(
        f"\nGram Newton-Schulz on the {len(shapes)} rectangular matrices of d{depth}: "
        f"standard {t['standard']:.4f} s, Gram {t['gram']:.4f} s, speedup {t['standard'] / t['gram']:.2f}x"
    )
    header = f"{'shape':>12} {'dtype':>9} {'max |gram-std|':>15} {'rel Frobenius':>14} {'std vs float64':>15}"
    print(header + "\n" + "-" * len(header))
    for shape, g in rect.items():
        exact = newton_schulz(g[:2], dtype=torch.float64)
        for dtype in (torch.bfloat16, torch.float32):
            std = newton_schulz(g[:2], dtype=dtype).double()
            diff = newton_schulz(g[:2], gram=True, dtype=dtype).double() - std
            print(
                f"{str(shape):>12} {str(dtype).removeprefix('torch.'):>9} {diff.abs().max().item():>15.3g} "
                f"{(diff.norm() / std.norm()).item():>14.3g} {((std - exact).norm() / exact.norm()).item():>15.3g}"
            )


def nanochat_muon_step(
    stacked_grads,
    stacked_params,
    momentum_buffer,
    second_momentum_buffer,
    momentum_t,
    lr_t,
    wd_t,
    beta2_t,
    ns_steps,
    red_dim,
    compute_dtype,
) -> None:
    """nanochat's muon_step_fused at 92d63d4 (nanochat/optim.py), transcribed op for op, without torch.compile."""
    momentum = momentum_t.to(stacked_grads.dtype)
    momentum_buffer.lerp_(stacked_grads, 1 - momentum)
    g = stacked_grads.lerp_(momentum_buffer, momentum)
    X = g.bfloat16() if compute_dtype == torch.bfloat16 else g  # nanochat's names
    target = X.float().norm(dim=(-2, -1), keepdim=True) / (X.size(-2) ** 0.5)
    row_norm = X.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)
    X = X * (target / row_norm).to(X.dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFS[:ns_steps]:
        if g.size(-2) > g.size(-1):
            A = X.mT @ X
            X = a * X + X @ (b * A + c * (A @ A))
        else:
            A = X @ X.mT
            X = a * X + (b * A + c * (A @ A)) @ X
    g = X.to(stacked_params.dtype)
    g = g * (min(g.size(-2), g.size(-1)) ** 0.5 / g.float().norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)).to(
        g.dtype
    )
    beta2 = beta2_t.to(g.dtype)
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    red_dim_size = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * red_dim_size).sqrt()
    second_momentum_buffer.lerp_(v_mean.to(dtype=second_momentum_buffer.dtype), 1 - beta2)
    step_size = second_momentum_buffer.clamp_min(1e-10).rsqrt()
    v_norm_new = ((v_mean * red_dim_size) * step_size.float().square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    g = g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)
    lr, wd = lr_t.to(g.dtype), wd_t.to(g.dtype)
    stacked_params.sub_(lr * g + lr * wd * stacked_params * ((g * stacked_params) >= 0))


def bench_head_step(depth: int, repeats: int, device: torch.device) -> None:
    """Recipe 2026-07's Muon step (ours) vs nanochat's formula run eagerly, on the same stacks."""
    shapes = model_shapes(depth)[0]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
    grads = [torch.randn(s, device=device) for s in shapes]
    stacks = {s: [i for i, t in enumerate(shapes) if t == s] for s in sorted(set(shapes))}
    groups = [
        {
            "params": [params[i] for i in idx],
            "kind": "muon",
            "name": f"muon/{s[0]}x{s[1]}",
            "lr": 0.02,
            "initial_lr": 0.02,
            "momentum": 0.95,
            "nesterov": True,
            "ns_steps": 5,
            "beta2": 0.9,
            "weight_decay": 0.0,
            "polar_dtype": str(dtype).removeprefix("torch."),
        }
        for s, idx in stacks.items()
    ]
    ours = NorMuonAdamW(groups, sharded=False)
    nc_state = {
        s: (
            torch.zeros(len(idx), *s, device=device),
            torch.zeros((len(idx), s[0], 1) if s[0] >= s[1] else (len(idx), 1, s[1]), device=device),
        )
        for s, idx in stacks.items()
    }
    # weight decay 0, as chat_sft.py runs: with decay, cautious weight decay's mask [g*p >= 0] makes the two updates
    # differ by lr*wd*|p| wherever rounding flips the sign of an update element near 0 (same cost either way)
    momentum_t, wd_t, beta2_t = (torch.tensor(v, dtype=torch.float32) for v in (0.95, 0.0, 0.9))

    def step_ours():
        for p, g in zip(params, grads):
            p.grad = g.clone()
        ours.step()

    @torch.no_grad()
    def step_nanochat():
        for s, idx in stacks.items():
            stacked = torch.stack([params[i] for i in idx])
            lr_t = torch.tensor(0.02 * max(1.0, s[0] / s[1]) ** 0.5, dtype=torch.float32)
            nanochat_muon_step(
                torch.stack([grads[i] for i in idx]),
                stacked,
                *nc_state[s],
                momentum_t,
                lr_t,
                wd_t,
                beta2_t,
                5,
                -1 if s[0] >= s[1] else -2,
                dtype,
            )
            torch._foreach_copy_([params[i] for i in idx], list(stacked.unbind(0)))

    # the same first step from the same state, for the difference of the updates
    start = [p.detach().clone() for p in params]
    step_ours()
    ours_update = [p.detach() - s0 for p, s0 in zip(params, start)]
    with torch.no_grad():
        for p, s0 in zip(params, start):
            p.copy_(s0)
    step_nanochat()
    nc_update = [p.detach() - s0 for p, s0 in zip(params, start)]
    diff = max((a - b).abs().max().item() for a, b in zip(ours_update, nc_update))
    size = max(b.abs().max().item() for b in nc_update)
    rel = (
        (sum((a - b).pow(2).sum() for a, b in zip(ours_update, nc_update)) / sum(b.pow(2).sum() for b in nc_update))
        .sqrt()
        .item()
    )
    t = interleaved({"ours (NorMuonAdamW)": step_ours, "nanochat's formula, eager": step_nanochat}, repeats, device)
    base = t["nanochat's formula, eager"]
    print(
        f"\nrecipe 2026-07, d{depth}: {len(shapes)} matrices in {len(stacks)} stacks, orthogonalisation in "
        f"{str(dtype).removeprefix('torch.')}; first-step updates differ by at most {diff:.3g} "
        f"({diff / size:.2g} of the largest update element; relative Frobenius {rel:.2g})"
    )
    header = f"{'Muon step, recipe 2026-07':<32} {'s':>9} {'/ nanochat':>10}"
    print(header + "\n" + "-" * len(header))
    for name, sec in t.items():
        print(f"{name:<32} {sec:>9.4f} {sec / base:>10.2f}")


# ---- the table: both recipes x both dtypes vs torch.optim.Muon
def torch_ns_float32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's `_zeropower_via_newtonschulz` (torch 2.13, torch/optim/_muon.py) with its bfloat16 cast
    replaced by a float32 copy: torch's step with the orthogonalisation in float32."""
    a, b, c = ns_coefficients
    ortho_grad = grad.to(torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram_matrix = ortho_grad @ ortho_grad.T
        gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
        ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    return ortho_grad


@contextlib.contextmanager
def torch_muon_in(dtype: torch.dtype):
    """torch.optim.Muon orthogonalising in ``dtype`` (bfloat16: as shipped)."""
    import torch.optim._muon as muon

    shipped = muon._zeropower_via_newtonschulz
    if dtype == torch.float32:
        muon._zeropower_via_newtonschulz = torch_ns_float32
    try:
        yield
    finally:
        muon._zeropower_via_newtonschulz = shipped


def table_steps(shapes: list[tuple[int, int]], device: torch.device, dtype: torch.dtype) -> dict:
    """The three steps, orthogonalising in ``dtype``, over shared parameters (set up here, gradients reset per call)."""
    name = str(dtype).removeprefix("torch.")
    params = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
    grads = [torch.randn(s, device=device) for s in shapes]
    muon = {"kind": "muon", "lr": 0.02, "initial_lr": 0.02, "momentum": 0.95, "nesterov": True, "ns_steps": 5}
    december = MuonAdamW([{"params": params, "name": "muon/matrix", "polar_dtype": name, **muon}], sharded=False)
    stacks = {s: [p for p, t in zip(params, shapes) if t == s] for s in sorted(set(shapes))}
    head = NorMuonAdamW(
        [
            {
                "params": ps,
                "name": f"muon/{s[0]}x{s[1]}",
                "beta2": 0.9,
                "weight_decay": 0.0,
                "polar_dtype": name,
                **muon,
            }
            for s, ps in stacks.items()
        ],
        sharded=False,
    )
    reference = torch.optim.Muon(
        params, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original"
    )

    def with_grads(step):
        def run():
            for p, g in zip(params, grads):
                p.grad = g.clone()
            step()

        return run

    def torch_step():
        with torch_muon_in(dtype):
            reference.step()

    return {
        ("2025-12 (MuonAdamW)", name): with_grads(december.step),
        ("2026-07 (NorMuonAdamW)", name): with_grads(head.step),
        ("torch.optim.Muon", name): with_grads(torch_step),
    }


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def bench_table(depths, dtypes, repeats: int, budget: float, max_call: float, device: torch.device) -> None:
    print(
        f"\noptimizer step over the block matrices, median of {repeats} interleaved rounds after a warm-up call; "
        f"'1 call': the warm-up alone (over {budget:.0f} s for {repeats} rounds); 'est.': not run, predicted over "
        f"{max_call:.0f} s from the previous depth x the FLOP ratio"
    )
    previous: dict = {}  # (row, dtype) -> (seconds, FLOPs) at the previous depth
    for depth in depths:
        shapes = model_shapes(depth)[0]
        flops = ns_flops(shapes)
        torch.manual_seed(0)
        fns = {k: v for dtype in dtypes for k, v in table_steps(shapes, device, dtype).items()}
        how, result = {}, {}
        for key, fn in fns.items():
            if key in previous and previous[key][0] * flops / previous[key][1] > max_call:
                result[key], how[key] = previous[key][0] * flops / previous[key][1], "est."
                continue
            result[key], how[key] = timed(fn, device), "1 call"  # the warm-up, timed
        rounds = {k: fns[k] for k in fns if how[k] == "1 call" and result[k] * repeats <= budget}
        times: dict = {k: [] for k in rounds}
        for _ in range(repeats):
            for k, fn in rounds.items():
                times[k].append(timed(fn, device))
        for k, v in times.items():
            result[k], how[k] = statistics.median(v), f"median {repeats}"
        previous = {k: (result[k], flops) for k in result}
        print(f"\nd{depth}: {len(shapes)} matrices, {flops / 1e9:.1f} GFLOP of Newton-Schulz per step")
        header = f"{'step':<24} {'dtype':<9} {'s':>10} {'measured':>9} {'/ torch same dtype':>19} {'f32 / bf16':>11}"
        print(header + "\n" + "-" * len(header))
        for (row, dtype), sec in result.items():
            ref = result[("torch.optim.Muon", dtype)]
            bf16 = result.get((row, "bfloat16"))
            own = f"{sec / bf16:>11.3f}" if bf16 and dtype != "bfloat16" else f"{'':>11}"
            print(f"{row:<24} {dtype:<9} {sec:>10.4f} {how[(row, dtype)]:>9} {sec / ref:>19.2f} {own}")


def print_state_bytes(depth: int, vocab: int) -> None:
    block, adamw = model_shapes(depth, vocab)
    print(
        f"\noptimizer state per rank, d{depth} (vocab {vocab}), from the sharding rule of the sharded step "
        f"(tests/optim/test_distributed.py and test_head_recipe.py check the rules against 2-process runs):"
    )
    for recipe, rule in (("2025-12", state_bytes_per_rank), ("2026-07", head_state_bytes_per_rank)):
        for world in (1, 2):
            per_rank = rule(block, adamw, world)
            print(
                f"  recipe {recipe}, {world} process{'es' if world > 1 else ''}: "
                + ", ".join(f"rank {r} {b / 2**20:,.2f} MiB" for r, b in enumerate(per_rank))
            )


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="d2 and 2 repeats: a smoke run")
    parser.add_argument("--depth", type=int, nargs="*", help="model depths (default: 4 8 12 on CPU, 12 20 on CUDA)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="*", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of timed rounds per cell at most")
    parser.add_argument("--max_call", type=float, default=60.0, help="a cell predicted slower than this is not run")
    parser.add_argument(
        "--emulate_no_bf16",
        action="store_true",
        help="oneDNN off: bfloat16 products emulated, as on a CPU without native bfloat16 (AVX2 only)",
    )
    parser.add_argument("--details", action="store_true", help="also the batching paths, Gram, nanochat's formula")
    parser.add_argument("--vocab", type=int, default=65536, help="vocabulary for the state sizes (nanochat's)")
    parser.add_argument("--only_head", action="store_true", help="--details: only recipe 2026-07 vs nanochat's")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the cores idle at start)")
    args = parser.parse_args()
    if args.emulate_no_bf16:
        torch.backends.mkldnn.enabled = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    depths = args.depth or ([2] if args.quick else [12, 20] if device.type == "cuda" else [4, 8, 12])
    repeats = 2 if args.quick else args.repeats
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
    else:
        print(use_cpu_threads(args.threads, flag="--threads"))
        native, measured = cpu_has_native_bfloat16()
        name = (
            f"CPU {cpu_name()}, {torch.get_num_threads()} threads; oneDNN "
            f"{'on' if torch.backends.mkldnn.enabled else 'off (--emulate_no_bf16)'}: {measured} "
            f"({'native' if native else 'emulated'})"
        )
    print(f"device: {name}; torch {torch.__version__}")
    if hasattr(os, "getloadavg"):
        print(f"load average before: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    dtypes = [getattr(torch, d) for d in args.dtypes]
    bench_table(depths, dtypes, repeats, args.budget, args.max_call, device)
    for depth in depths:
        if args.details:
            if not args.only_head:
                bench_step(depth, repeats, device)
                bench_gram(depth, repeats, device)
            bench_head_step(depth, repeats, device)
        print_state_bytes(depth, args.vocab)
    if hasattr(os, "getloadavg"):
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
