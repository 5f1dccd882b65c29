"""Per-rank memory of the sharded optimizer, ZeRO-2 (optim/reduction.py) next to FSDP2 (optim/fsdp.py): parameter,
gradient and optimizer-state bytes held at the step and their peak, and the step time with the ZeRO-2 reduction
during backward ("overlap") and at the step, and under FSDP2 ("fsdp2": `fully_shard` per block and the root).

    python benchmarks/optim_memory.py              # CPU: demo (d4) and d8 at W = 1, 2, 4; d12 at W = 1, 2
    python benchmarks/optim_memory.py --quick      # demo shape only, W = 1, 2, 2 steps
    python benchmarks/optim_memory.py --cuda       # one CUDA GPU, W = 1, d12 and d20 (+ max_memory_allocated)
    python benchmarks/optim_memory.py --rules      # d20, d32, 8B Llama per GPU at W = 1, 2, 8, from the layout rules
    python benchmarks/optim_memory.py --comm       # collectives of one step at W = 2, 4: ours vs torch.optim.Muon

CPU: W gloo processes of one thread each (torch.distributed, as `accelerate launch` runs them), every rank with
its own random micro-batch (batch x seq tokens), recipe 2026-07 by default (--recipe 2025-12 for December's). The
bytes are the tensors' own: gradients = every ``.grad`` plus the reduced pieces kept beside them plus the buckets in
flight, sampled at every gradient hook (after the reduction's) and around the step; state = the optimizer state.
"peak" is the largest sample of gradients + state. rss = the process's peak resident set (ru_maxrss), for the whole
process (model, activations, torch itself). On CUDA: torch.cuda.max_memory_allocated of the whole training step.
"overlap" = `MuonAdamW.reduce_during_backward` (what the Trainer does); "at step" = every reduction at the step.
The layout rules (`grad_bytes_per_rank`, `state_bytes_per_rank`) are checked against real 2-process runs by
tests/optim/test_distributed.py, `fsdp_bytes_per_rank` (and the state rule under FSDP2) by tests/optim/test_fsdp.py.
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
    buckets in flight): its Muon matrices (2025-12: matrix i of each shape to rank i % W; 2026-07: contiguous chunks
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


def fsdp_bytes_per_rank(shapes: list[tuple[int, ...]], world: int, element: int = 4) -> list[int]:
    """Parameter bytes per rank under FSDP2 (``Shard(0)``: rows [start, end) of every parameter, torch.chunk's
    split); its gradients after the reduce-scatter are the same bytes. ``element``: bytes per element."""
    return [
        sum(element * _rows(shape[0], world, r) * torch.Size(shape[1:]).numel() for shape in shapes)
        for r in range(world)
    ]


def llama8b_shapes() -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """(Muon matrices, AdamW parameters) of a Llama-3-8B-shaped model: 32 layers, width 4096, MLP 14336, 8 KV heads
    of 128, vocab 128256, untied head; the RMSNorm weights and embeddings go to AdamW (the "roles" routing)."""
    n, mlp, kv = 4096, 14336, 8 * 128
    block = [(n, n), (kv, n), (kv, n), (n, n), (mlp, n), (mlp, n), (n, mlp)]  # q, k, v, o, gate, up, down
    return block * 32, [(128256, n), (128256, n)] + [(n,)] * (2 * 32 + 1)


def state_bytes_per_rank(
    muon: list[tuple[int, int]], adamw: list[tuple[int, int]], world: int, recipe: str
) -> list[int]:
    """Optimizer-state bytes per rank (benchmarks/optim_step.py's rules, float32)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from optim_step import head_state_bytes_per_rank
    from optim_step import state_bytes_per_rank as december

    return (december if recipe == "2025-12" else head_state_bytes_per_rank)(muon, adamw, world)


def rules_table() -> None:
    """What a d20, a d32 (December G0 architecture, vocab 65536) and an 8B Llama-shaped model hold per GPU at W = 1,
    2, 8, from the rules above: float32 parameters and gradients (bf16 autocast keeps float32 parameters), float32
    optimizer state (the same layout on both paths); ZeRO-2 keeps every parameter whole, FSDP2 1/W of each."""
    print("per GPU (the fullest rank), GiB; grads: after backward (ZeRO-2: with the reduction during backward)")
    print(
        f"{'model':>8} {'recipe':>8} {'W':>3} {'params':>7} {'grads':>7} {'state':>7} {'ZeRO-2':>7} "
        f"{'FSDP2 p':>7} {'FSDP2':>7}"
    )
    models = {name: model_shapes(*SHAPES[name]) for name in ("d20", "d32")} | {"llama-8B": llama8b_shapes()}
    for name, (muon, adamw) in models.items():
        params = 4 * sum(torch.Size(shape).numel() for shape in muon + adamw)
        for recipe in ("2025-12", "2026-07"):
            for world in (1, 2, 8):
                g = max(grad_bytes_per_rank(muon, adamw, world, recipe))
                s = max(state_bytes_per_rank(muon, adamw, world, recipe))
                f = max(fsdp_bytes_per_rank(muon + adamw, world))
                fsdp = max(2 * f + t for f, t in zip(fsdp_bytes_per_rank(muon + adamw, world),
                                                     state_bytes_per_rank(muon, adamw, world, recipe)))  # fmt: skip
                print(
                    f"{name:>8} {recipe:>8} {world:>3} {params / 2**30:7.2f} {g / 2**30:7.2f} {s / 2**30:7.2f} "
                    f"{(params + g + s) / 2**30:7.2f} {f / 2**30:7.2f} {fsdp / 2**30:7.2f}"
                )


# ---- measurement --------------------------------------------------------------------------------------------------
def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this rank's shard


def _params(opt) -> int:
    return sum(_local(p).numel() * p.element_size() for g in opt.param_groups for p in g["params"])


def _held(opt) -> int:
    """Gradient bytes this rank holds now: every .grad, the reduced pieces, the buckets in flight (distinct
    storages)."""
    tensors = [_local(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None]
    reducer = getattr(opt, "_reducer", None)
    if reducer is not None:
        tensors += list(reducer.pieces.values()) + [buf for bucket in reducer.in_flight for _, buf, _ in bucket]
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
    if cfg.get("fsdp") and world > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    opt = build_optimizer(model, recipe=cfg["recipe"])
    if cfg.get("comm"):
        return _comm(model, opt, rank, world, vocab, cfg)
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
        "params": _params(opt),
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


class _Collectives(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the collectives dispatched (c10d and functional c10d ops) and their bytes: per call the largest tensor
    argument (the gathered output, the scattered input: what a rank's link carries, to within 1/W)."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.bytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor turn the op into its collectives first (as CommDebugMode does)
        name = getattr(func, "namespace", ""), getattr(func, "__name__", "")
        if name[0] in ("c10d", "c10d_functional", "_c10d_functional") and not name[1].startswith("wait_tensor"):
            leaves = torch.utils._pytree.tree_leaves((args, kwargs or {}))
            sizes = [t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor)]
            self.count += 1
            self.bytes += max(sizes, default=0)
        return func(*args, **(kwargs or {}))


def _comm(model, opt, rank: int, world: int, vocab: int, cfg: dict) -> list[dict]:
    """One step's collectives on the FSDP2 model: ours, then torch.optim.Muon on the same Muon matrices (its
    Newton-Schulz on the DTensor shards) with torch.optim.AdamW on the rest, each after its own backward."""
    import torch.distributed as dist

    muon = [p for g in opt.param_groups if g["kind"] == "muon" for p in g["params"]]
    rest = [p for g in opt.param_groups if g["kind"] != "muon" for p in g["params"]]
    theirs = [torch.optim.Muon(muon, lr=0.02), torch.optim.AdamW(rest, lr=1e-3)]
    ids = torch.randint(0, vocab, (cfg["batch"], cfg["seq"] + 1), generator=torch.Generator().manual_seed(rank))
    result = {}
    for name, step in (("ours", opt.step), ("torch.optim.Muon", lambda: [o.step() for o in theirs])):
        model(input_ids=ids, labels=ids).loss.backward()
        with _Collectives() as seen:
            step()
        result[name] = (seen.count, seen.bytes)
        model.zero_grad(set_to_none=True)
    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    dist.destroy_process_group()
    return everyone


def comm_table(args) -> None:
    """Collectives of one optimizer step on the same FSDP2 model (demo shape): ours vs torch.optim.Muon."""
    print(f"{'W':>2} {'optimizer':>17} {'collectives':>11} {'MiB':>8}  (one step, rank 0, recipe {args.recipe})")
    for world in (2, 4):
        cfg = {"shape": "demo", "recipe": args.recipe, "steps": 1, "batch": args.batch, "seq": args.seq,
               "overlap": False, "device": "cpu", "fsdp": True, "comm": True}  # fmt: skip
        for name, (count, nbytes) in run(world, cfg)[0].items():
            print(f"{world:>2} {name:>17} {count:>11} {nbytes / 2**20:8.1f}", flush=True)


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
    ap.add_argument("--rules", action="store_true", help="only the d20/d32/8B table from the layout rules")
    ap.add_argument("--comm", action="store_true", help="only the collectives of one FSDP2 step, ours vs torch's")
    ap.add_argument("--recipe", default="2026-07", choices=("2025-12", "2026-07"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    if args.rules:
        rules_table()
        return
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs; load: {os.getloadavg()}; torch {torch.__version__}")
    if args.comm:
        comm_table(args)
        return
    if args.cuda:
        plan = [("d12", (1,)), ("d20", (1,))]
        args.batch, args.seq = max(args.batch, 8), max(args.seq, 2048)
    elif args.quick:
        plan, args.steps = [("demo", (1, 2))], 2
    else:
        plan = [("demo", (1, 2, 4)), ("d8", (1, 2, 4)), ("d12", (1, 2))]
    device = "cuda" if args.cuda else "cpu"
    print(f"recipe {args.recipe}, {args.batch} x {args.seq} tokens per rank, median of {args.steps - 1} steps (MiB)")
    cols = f"{'params':>8} {'grads@step':>10} {'state':>8} {'peak':>8} {'rule g+s':>8} {'rss':>8}"
    print(f"{'model':>6} {'W':>2} {'mode':>8} {cols} {'max_alloc':>9} {'step s':>7} {'vs W=1':>6}")
    mib = 2**20
    for shape, worlds in plan:
        muon, adamw = model_shapes(*SHAPES[shape])
        base = None
        for world in worlds:
            for mode in ("overlap", "at step", "fsdp2") if world > 1 else ("-",):
                cfg = {"shape": shape, "recipe": args.recipe, "steps": args.steps, "batch": args.batch, "seq": args.seq,
                       "overlap": mode == "overlap", "fsdp": mode == "fsdp2", "device": device}  # fmt: skip
                ranks = run(world, cfg) if not args.cuda else measure(0, 1, 0, cfg)
                worst = max(ranks, key=lambda r: r["peak"])
                grads = (
                    fsdp_bytes_per_rank(muon + adamw, world)
                    if mode == "fsdp2"
                    else grad_bytes_per_rank(muon, adamw, world, args.recipe)
                )
                rule = max(g + s for g, s in zip(grads, state_bytes_per_rank(muon, adamw, world, args.recipe)))
                t = max(r["step_s"] for r in ranks)
                base = base or t
                alloc = f"{worst['max_allocated'] / mib:9.0f}" if "max_allocated" in worst else f"{'-':>9}"
                print(
                    f"{shape:>6} {world:>2} {mode:>8} {worst['params'] / mib:8.1f} "
                    f"{worst['grads_at_step'] / mib:10.1f} {worst['state'] / mib:8.1f} {worst['peak'] / mib:8.1f} "
                    f"{rule / mib:8.1f} {worst['rss'] / mib:8.0f} {alloc} {t:7.3f} {t / base:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
