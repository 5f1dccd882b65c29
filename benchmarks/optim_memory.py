"""Per-rank memory of the sharded optimizer (ZeRO-2, optim/reduction.py): gradient and optimizer-state bytes held at
the step and their peak, and the step time with the reduction during backward ("overlap") and at the step.

    python benchmarks/optim_memory.py              # CPU: demo (d4) and d8 at W = 1, 2, 4; d12 at W = 1, 2
    python benchmarks/optim_memory.py --quick      # demo shape only, W = 1, 2, 2 steps
    python benchmarks/optim_memory.py --cuda       # one CUDA GPU, W = 1, d12 and d20 (+ max_memory_allocated)
    python benchmarks/optim_memory.py --rules      # d20 and d32 per GPU at W = 1, 2, 8, from the layout rules

CPU: W gloo processes of one thread each (torch.distributed, as `accelerate launch` runs them), every rank with
its own random micro-batch (batch x seq tokens), recipe 2026-07 by default (--recipe 2025-12 for December's). The
bytes are the tensors' own: gradients = every ``.grad`` plus the reduced pieces kept beside them plus the units in
flight, sampled at every gradient hook (after the reduction's) and around the step; state = the optimizer state.
"peak" is the largest sample of gradients + state. rss = the process's peak resident set (ru_maxrss), for the whole
process (model, activations, torch itself). On CUDA: torch.cuda.max_memory_allocated of the whole training step.
"overlap" = `MuonAdamW.reduce_during_backward` (what the Trainer does); "at step" = every reduction at the step.
The layout rules (`grad_bytes_per_rank`, `state_bytes_per_rank`) are checked against real 2-process runs by
tests/optim/test_distributed.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from nanochat_hf.optim.head import SMALL_NUMEL

# name: (depth, vocab); nanochat's depth rule sets width 64*depth. demo: configs/demo.yaml's model (demo vocab 4096)
SHAPES = {"demo": (4, 4096), "d8": (8, 4096), "d12": (12, 65536), "d20": (20, 65536), "d32": (32, 65536)}


# ---- the layout rules (optim/optimizer.py and optim/head.py docstrings) ------------------------------------------
def model_shapes(depth: int, vocab: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(Muon matrices, AdamW parameters) of nanochat's December (G0) model of that depth, in model order."""
    n = 64 * depth
    block = [(n, n), (n, n), (n, n), (n, n), (4 * n, n), (n, 4 * n)]  # c_q, c_k, c_v, c_proj, c_fc, mlp.c_proj
    return block * depth, [(vocab, n), (vocab, n)]  # wte, lm_head


def _rows(n: int, world: int, rank: int) -> int:
    k = -(-n // world)
    return max(0, min(n, (rank + 1) * k) - min(n, rank * k))


def grad_bytes_per_rank(
    muon: list[tuple[int, int]], adamw: list[tuple[int, int]], world: int, recipe: str, element: int = 4
) -> list[int]:
    """Gradient bytes each rank holds after the last backward with the reduction during backward (not counting the
    one unit in flight): its Muon matrices (2025-12: matrix i of each shape to rank i % W; 2026-07: contiguous chunks
    of ceil(K/W) of each shape's stack), its rows of each AdamW parameter, every small (< SMALL_NUMEL) 2026-07
    AdamW parameter whole. ``element``: bytes per gradient element (the parameters' dtype)."""
    per_rank = [0] * world
    by_shape: dict[tuple[int, int], int] = {}
    for shape in muon:
        by_shape[shape] = by_shape.get(shape, 0) + 1
    for shape, count in by_shape.items():
        k = -(-count // world)
        for i in range(count):
            per_rank[i % world if recipe == "2025-12" else i // k] += element * shape[0] * shape[1]
    for shape in adamw:
        numel = torch.Size(shape).numel()
        for r in range(world):
            whole = recipe != "2025-12" and numel < SMALL_NUMEL
            per_rank[r] += element * (numel if whole else _rows(shape[0], world, r) * numel // shape[0])
    return per_rank


def state_bytes_per_rank(
    muon: list[tuple[int, int]], adamw: list[tuple[int, int]], world: int, recipe: str
) -> list[int]:
    """Optimizer-state bytes per rank (benchmarks/optim_step.py's rules, float32)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from optim_step import head_state_bytes_per_rank
    from optim_step import state_bytes_per_rank as december

    return (december if recipe == "2025-12" else head_state_bytes_per_rank)(muon, adamw, world)


def rules_table() -> None:
    """What a d20 and a d32 run (December G0 architecture, vocab 65536) hold per GPU at W = 1, 2, 8, from the rules
    above: float32 parameters and gradients (bf16 autocast keeps float32 parameters), float32 optimizer state."""
    print("per GPU (the fullest rank), GiB; grads: after backward with the reduction during backward")
    print(f"{'model':>6} {'recipe':>8} {'W':>3} {'params':>7} {'grads':>7} {'state':>7} {'sum':>7}  grads+state vs W=1")
    for name in ("d20", "d32"):
        muon, adamw = model_shapes(*SHAPES[name])
        params = 4 * sum(a * b for a, b in muon + adamw)
        for recipe in ("2025-12", "2026-07"):
            base = None
            for world in (1, 2, 8):
                g = max(grad_bytes_per_rank(muon, adamw, world, recipe))
                s = max(state_bytes_per_rank(muon, adamw, world, recipe))
                base = base or g + s
                print(
                    f"{name:>6} {recipe:>8} {world:>3} {params / 2**30:7.2f} {g / 2**30:7.2f} {s / 2**30:7.2f} "
                    f"{(params + g + s) / 2**30:7.2f}  {(g + s) / base:.2f}"
                )


# ---- measurement --------------------------------------------------------------------------------------------------
def _held(opt) -> int:
    """Gradient bytes this rank holds now: every .grad, the reduced pieces, the units in flight (distinct storages)."""
    tensors = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    reducer = getattr(opt, "_reducer", None)
    if reducer is not None:
        tensors += list(reducer.pieces.values()) + [rec[2] for rec in reducer.launched if rec[2] is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _state(opt) -> int:
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def measure(rank: int, world: int, port: int, cfg: dict) -> dict:
    """One rank's run: steps of forward + backward + optimizer step, returns its bytes and times."""
    import torch.distributed as dist

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.optim import build_optimizer

    torch.set_num_threads(1)
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    depth, vocab = SHAPES[cfg["shape"]]
    torch.manual_seed(0)
    config = NanoChatGPTConfig.from_depth(depth, vocab_size=vocab, sequence_len=cfg["seq"])
    model = NanoChatGPTForCausalLM(config).to(device)
    with torch.no_grad():  # random everywhere (a fresh model zeroes lm_head and the output projections)
        for p in model.parameters():
            p.normal_(0, 0.02)
    opt = build_optimizer(model, recipe=cfg["recipe"])
    if cfg["overlap"]:
        opt.reduce_during_backward(model_order=tuple(model.parameters()))
    peak = [0]

    def sample(_=None) -> None:
        peak[0] = max(peak[0], _held(opt) + _state(opt))

    for p in model.parameters():  # registered after the reduction's hooks, so it sees their effect
        p.register_post_accumulate_grad_hook(sample)
    g = torch.Generator().manual_seed(1 + rank)
    times, at_step = [], 0
    for step in range(cfg["steps"]):
        ids = torch.randint(0, vocab, (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        at_step = _held(opt)
        sample()
        opt.step()
        sample()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        times.append(time.perf_counter() - t0)
    result = {
        "grads_at_step": at_step,
        "state": _state(opt),
        "peak": peak[0],
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
    }
    if device.type == "cuda":
        result["max_allocated"] = torch.cuda.max_memory_allocated()
    if world > 1:
        everyone = [None] * world
        dist.all_gather_object(everyone, result)
        dist.destroy_process_group()
        return everyone
    return [result]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, cfg: dict, tries: int = 3) -> list[dict]:
    """``measure`` in ``world`` fresh processes (one process each, so ru_maxrss is this configuration's own); tried
    again on another port when a rank fails (on a shared machine the free port can be taken before rank 0 binds it)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import optim_memory as m; "
        "r = m.measure(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])); "
        "sys.argv[2] == '0' and json.dump(r, open(sys.argv[6], 'w'))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(tries):
        with tempfile.TemporaryDirectory() as tmp:
            out, port = os.path.join(tmp, "result.json"), _free_port()
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", code, here, str(r), str(world), str(port), json.dumps(cfg), out], env=env
                )
                for r in range(world)
            ]
            while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
                time.sleep(0.5)
            failed = any(p.poll() for p in procs)
            for p in procs:
                if failed and p.poll() is None:
                    p.kill()  # a rank failed: the others would wait for it forever
                p.wait()
            if not failed:
                with open(out) as f:
                    return json.load(f)
    raise SystemExit(f"optim_memory: a rank failed {tries} times ({cfg['shape']}, W={world})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="demo shape, W = 1, 2, 2 steps")
    ap.add_argument("--cuda", action="store_true", help="one CUDA GPU, W = 1")
    ap.add_argument("--rules", action="store_true", help="only the d20/d32 table from the layout rules")
    ap.add_argument("--recipe", default="2026-07", choices=("2025-12", "2026-07"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    if args.rules:
        rules_table()
        return
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs; load: {os.getloadavg()}; torch {torch.__version__}")
    if args.cuda:
        plan = [("d12", (1,)), ("d20", (1,))]
        args.batch, args.seq = max(args.batch, 8), max(args.seq, 2048)
    elif args.quick:
        plan, args.steps = [("demo", (1, 2))], 2
    else:
        plan = [("demo", (1, 2, 4)), ("d8", (1, 2, 4)), ("d12", (1, 2))]
    device = "cuda" if args.cuda else "cpu"
    print(f"recipe {args.recipe}, {args.batch} x {args.seq} tokens per rank, median of {args.steps - 1} steps (MiB)")
    cols = f"{'grads@step':>10} {'state':>8} {'peak':>8} {'rule g+s':>8} {'rss':>8}"
    print(f"{'model':>6} {'W':>2} {'mode':>8} {cols} {'max_alloc':>9} {'step s':>7} {'vs W=1':>6}")
    mib = 2**20
    for shape, worlds in plan:
        muon, adamw = model_shapes(*SHAPES[shape])
        base = None
        for world in worlds:
            for overlap in (True, False) if world > 1 else (False,):
                cfg = {"shape": shape, "recipe": args.recipe, "steps": args.steps, "batch": args.batch,
                       "seq": args.seq, "overlap": overlap, "device": device}  # fmt: skip
                ranks = run(world, cfg) if not args.cuda else measure(0, 1, 0, cfg)
                worst = max(ranks, key=lambda r: r["peak"])
                rule = max(
                    g + s
                    for g, s in zip(
                        grad_bytes_per_rank(muon, adamw, world, args.recipe),
                        state_bytes_per_rank(muon, adamw, world, args.recipe),
                    )
                )
                t = max(r["step_s"] for r in ranks)
                base = base or t
                alloc = f"{worst['max_allocated'] / mib:9.0f}" if "max_allocated" in worst else f"{'-':>9}"
                mode = "overlap" if overlap else ("at step" if world > 1 else "-")
                print(
                    f"{shape:>6} {world:>2} {mode:>8} {worst['grads_at_step'] / mib:10.1f} "
                    f"{worst['state'] / mib:8.1f} {worst['peak'] / mib:8.1f} {rule / mib:8.1f} "
                    f"{worst['rss'] / mib:8.0f} {alloc} {t:7.3f} {t / base:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
