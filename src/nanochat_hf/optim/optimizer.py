"""One torch Optimizer holding nanochat's Muon and AdamW groups, with an optional sharded (ZeRO-2 style) step.

Single process: Muon (Newton-Schulz batched over same-shaped matrices where that is faster) + AdamW (float32 moments).
torch.distributed initialised with world size W > 1: the optimizer does all gradient communication itself
(``reduces_gradients`` is True, so the caller must NOT all-reduce gradients):
- AdamW: reduce-scatter (average) each gradient along dim 0, rank r owns rows [r*k, (r+1)*k) with k = ceil(n/W)
  (dim 0 is zero-padded to k*W when W does not divide it), keeps moments for those rows only, updates them and
  all-gathers the parameter.
- Muon: within each (group, shape) bucket parameter i is owned by rank i % W; every chunk of W parameters is
  reduce-scattered (short chunks padded with zeros) so each owner receives its parameter's averaged gradient,
  the owner alone keeps the momentum and runs Newton-Schulz (batched over everything it owns in the bucket),
  then the chunk's parameters are all-gathered.
Every collective is launched asynchronously and waited on just before its result is needed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import UserError
from .kernels import adamw_update, muon_update

_MUON_KEYS = ("lr", "momentum", "nesterov", "ns_steps")
_ADAMW_KEYS = ("lr", "betas", "eps", "weight_decay")


def _shape_buckets(params: list[Tensor]) -> list[list[Tensor]]:
    """Parameters grouped by shape, buckets in order of first appearance, params in group order."""
    buckets: dict[tuple[int, ...], list[Tensor]] = {}
    for p in params:
        buckets.setdefault(tuple(p.shape), []).append(p)
    return list(buckets.values())


def _muon_options(group: dict[str, Any]) -> dict[str, Any]:
    """muon_update's keyword arguments from a Muon param group (the Newton-Schulz keys are optional)."""
    return {
        "lr": group["lr"],
        "momentum": group["momentum"],
        "nesterov": group["nesterov"],
        "ns_steps": group["ns_steps"],
        "batch_size": group.get("ns_batch_size"),
        "gram": group.get("ns_gram", False),
        "dtype": getattr(torch, group.get("polar_dtype", "bfloat16")),
    }


class _SliceWork:
    """Async handle for the all-reduce fallback of reduce-scatter: on wait, copy this rank's slice out."""

    def __init__(self, work: Any, full: Tensor, out: Tensor, rank: int, world: int):
        self.work, self.full, self.out, self.rank, self.world = work, full, out, rank, world

    def wait(self) -> None:
        self.work.wait()
        self.out.copy_(self.full.chunk(self.world)[self.rank])


class _Done:
    """A collective already waited on (waiting again may copy its result over the clipped gradient)."""

    def wait(self) -> None:
        return


class MuonAdamW(torch.optim.Optimizer):
    """Muon for hidden matrices plus AdamW for embedding/unembedding, in one optimizer (see module docstring).

    Every param group needs ``kind`` ("muon" or "adamw"), ``name``, ``lr`` and ``initial_lr``; Muon groups
    also ``momentum``, ``nesterov``, ``ns_steps``; AdamW groups ``betas``, ``eps``, ``weight_decay``.
    Muon groups may set ``ns_batch_size`` (matrices per batched Newton-Schulz; default: by device and shape),
    ``ns_gram`` (see :meth:`set_newton_schulz`) and ``polar_dtype`` (the orthogonalisation's dtype by name;
    default "bfloat16", nanochat's December choice; `build_optimizer` always sets it, see optim/precision.py).
    Use :func:`routing.build_optimizer` to get nanochat's grouping.
    """

    def __init__(self, param_groups: list[dict[str, Any]], process_group: Any = None, sharded: bool | None = None):
        for i, group in enumerate(param_groups):
            kind = group.get("kind")
            if kind not in ("muon", "adamw"):
                raise ValueError(f"param group {i}: 'kind' must be 'muon' or 'adamw', got {kind!r}")
            required = ("name", "initial_lr") + (_MUON_KEYS if kind == "muon" else _ADAMW_KEYS)
            missing = [k for k in required if k not in group]
            if missing:
                raise ValueError(f"param group {i} ({kind}): missing {missing}")
            if kind == "muon":
                bad = [tuple(p.shape) for p in group["params"] if p.ndim != 2]
                if bad:
                    raise ValueError(f"param group {group['name']!r}: Muon needs 2-D matrices, got shapes {bad}")
        super().__init__(param_groups, defaults={})
        self.process_group = process_group
        if sharded is None:  # auto: shard whenever several processes train together
            sharded = dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1
        self.world_size = dist.get_world_size(process_group) if sharded else 1
        self.rank = dist.get_rank(process_group) if sharded else 0
        self.reduces_gradients = self.world_size > 1
        # Clip the (averaged) gradient to this global norm in step() (0: off), at every world size with the same
        # formula: sqrt of the sum of squares. torch.nn.utils.clip_grad_norm_'s fp32 vector_norm differs from it
        # by up to ~1e-4 relative on CPU, so clipping outside the optimizer would make 1 and W processes differ.
        self.max_grad_norm = 0.0
        self.last_grad_norm: float | None = None  # pre-clip norm of the averaged gradient, when clipping
        if self.reduces_gradients:
            self._native_rs = self._probe_reduce_scatter()
            # AVG is only relied upon where it is native (NCCL, which serves CUDA tensors also in a mixed
            # "cpu:gloo,cuda:nccl" group); elsewhere SUM then divide, which is exact for W = 2^k.
            on_cuda = self.param_groups[0]["params"][0].is_cuda
            self._native_avg = self._native_rs and on_cuda and "nccl" in str(dist.get_backend(process_group))

    # ----------------------------------------------------------------------------------------- public
    def set_muon_momentum(self, momentum: float) -> None:
        """Set the momentum of every Muon group (nanochat warms it 0.85 -> 0.95 over 300 steps)."""
        for group in self.param_groups:
            if group["kind"] == "muon":
                group["momentum"] = momentum

    def set_newton_schulz(self, *, gram: bool | None = None, batch_size: int | None = None) -> None:
        """Choose the Newton-Schulz variant of every Muon group.

        ``gram=True`` iterates on the Gram matrix of rectangular matrices (fewer FLOPs, same polynomial; in
        bfloat16 about twice the standard iteration's rounding error). It is off by default because it changes the
        updates by a few percent and must first be shown to reproduce nanochat's training curve on the demo.
        ``batch_size``: matrices per batched matmul (0: all of a shape), instead of the device/shape default.
        """
        for group in self.param_groups:
            if group["kind"] == "muon":
                if gram is not None:
                    group["ns_gram"] = gram
                if batch_size is not None:
                    group["ns_batch_size"] = batch_size

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.world_size == 1:
            self._step_local()
        else:
            self._step_sharded()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (sharded when world size > 1), tagged with the layout that produced it."""
        sd = super().state_dict()
        sd["sharding"] = {"world_size": self.world_size, "rank": self.rank}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by this same rank of the same world size (what resuming a run does).

        Written out instead of torch's because torch casts floating state to the parameter dtype (bfloat16
        moments would lose the float32 AdamW state) and knows nothing about sliced AdamW moments.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise UserError(
                f"optimizer state_dict has {len(saved_groups)} param groups, "
                f"this optimizer has {len(self.param_groups)}"
            )
        layout = state_dict.get("sharding")
        if layout is None:
            raise UserError("optimizer state_dict has no 'sharding' entry: it was not written by MuonAdamW.state_dict")
        if (layout["world_size"], layout["rank"]) != (self.world_size, self.rank):
            raise UserError(
                f"optimizer state_dict was saved by rank {layout['rank']} of {layout['world_size']}, "
                f"this is rank {self.rank} of {self.world_size}: the state is sharded per rank, resume "
                "with the number of processes that saved it"
            )
        by_index: dict[int, Tensor] = {}
        for group, saved in zip(self.param_groups, saved_groups):
            if len(group["params"]) != len(saved["params"]) or saved["name"] != group["name"]:
                raise UserError(
                    f"optimizer state_dict group {saved['name']!r} with {len(saved['params'])} "
                    f"params does not match group {group['name']!r} with {len(group['params'])}"
                )
            by_index.update(zip(saved["params"], group["params"]))
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for index, saved_state in state_dict["state"].items():
            p = by_index[int(index)]
            state[p] = {
                k: (v.detach().to(p.device, copy=True) if isinstance(v, Tensor) else v) for k, v in saved_state.items()
            }
        self.state = state
        for group, saved in zip(self.param_groups, saved_groups):
            # polar_dtype is this machine's choice (optim/precision.py), not state: a run resumed elsewhere keeps it
            group.update({k: v for k, v in saved.items() if k not in ("params", "polar_dtype")})

    # ---------------------------------------------------------------------------------------- helpers
    def _adamw_state(self, p: Tensor, rows: int) -> dict[str, Any]:
        st = self.state[p]
        if not st:
            shape = (rows, *p.shape[1:])
            st["step"] = 0
            st["exp_avg"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
            st["exp_avg_sq"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
        return st

    def _muon_buf(self, p: Tensor) -> Tensor:
        st = self.state[p]
        if not st:
            st["momentum_buffer"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        return st["momentum_buffer"]

    def _rows(self, p: Tensor) -> tuple[int, int, int]:
        """(k, start, end): rows per rank (dim 0 padded to k*W) and this rank's real rows [start, end)."""
        k = -(-p.shape[0] // self.world_size)
        start = min(self.rank * k, p.shape[0])
        return k, start, min(start + k, p.shape[0])

    def _probe_reduce_scatter(self) -> bool:
        """Whether the backend implements reduce_scatter_single (older gloo builds do not)."""
        device = self.param_groups[0]["params"][0].device
        try:
            dist.reduce_scatter_single(
                torch.empty(1, device=device), torch.zeros(self.world_size, device=device), group=self.process_group
            )
            return True
        except (RuntimeError, NotImplementedError, ValueError):
            return False

    def _reduce_scatter(self, out: Tensor, full: Tensor) -> Any:
        """Async reduce-scatter of ``full`` (W*len(out) along dim 0) into ``out``; average done in _averaged."""
        op = dist.ReduceOp.AVG if self._native_avg else dist.ReduceOp.SUM
        if self._native_rs:
            return dist.reduce_scatter_single(out, full, op=op, group=self.process_group, async_op=True)
        # Fallback: all-reduce the whole tensor and keep our slice. Costs about twice the traffic of a
        # reduce-scatter (a ring all-reduce is a reduce-scatter plus an all-gather) and a full-size copy.
        full = full.clone()
        work = dist.all_reduce(full, op=op, group=self.process_group, async_op=True)
        return _SliceWork(work, full, out, self.rank, self.world_size)

    def _averaged(self, reduced: Tensor) -> Tensor:
        return reduced if self._native_avg else reduced.div_(self.world_size)

    def _grad(self, p: Tensor) -> Tensor:
        if p.grad is None:  # every rank must join every collective, so a missing gradient cannot be skipped
            raise RuntimeError(f"sharded optimizer step: a parameter of shape {tuple(p.shape)} has no gradient")
        return p.grad.contiguous()

    def _reduce_scatter_rows(self, p: Tensor) -> tuple[Tensor, Any]:
        """Launch the reduce-scatter of p's gradient along dim 0 (zero-padded to k*W rows): (this rank's k rows,
        work)."""
        grad = self._grad(p)
        k, _, _ = self._rows(p)
        if k * self.world_size != p.shape[0]:
            padded = grad.new_zeros((k * self.world_size, *grad.shape[1:]))
            padded[: p.shape[0]] = grad
            grad = padded
        out = grad.new_empty((k, *grad.shape[1:]))
        return out, self._reduce_scatter(out, grad)

    def _adamw_rows_step(self, group: dict[str, Any], p: Tensor, grad: Tensor) -> tuple[Any, Callable[[], Any] | None]:
        """AdamW on this rank's rows of p (``grad``: its averaged k rows), then launch the all-gather of p: returns
        (work, what to run once it is done)."""
        world, rank, pg = self.world_size, self.rank, self.process_group
        k, start, end = self._rows(p)
        st = self._adamw_state(p, end - start)
        st["step"] += 1
        if end > start:
            adamw_update(
                p[start:end],
                grad[: end - start],
                st["exp_avg"],
                st["exp_avg_sq"],
                step=st["step"],
                lr=group["lr"],
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
            )
        if k * world == p.shape[0]:  # in place: our rows already sit at our offset of p
            return dist.all_gather_single(p, p[start:end], group=pg, async_op=True), None
        full = p.new_empty((k * world, *p.shape[1:]))
        mine = full[rank * k : (rank + 1) * k]
        mine[: end - start] = p[start:end]
        work = dist.all_gather_single(full, mine, group=pg, async_op=True)
        return work, lambda p=p, full=full: p.copy_(full[: p.shape[0]])

    def _clip_reduced(self, adamw_outs: list[Tensor], muon_chunks: list, adamw_works: list) -> None:
        """Scale the reduced gradients so the averaged gradient's global norm is at most max_grad_norm.

        Waits for every reduce-scatter first (clipping needs the whole norm). The ranks' reduced pieces are
        disjoint (padding is zero), so the norm is the square root of the all-reduced sum of their squares;
        the coefficient is torch.nn.utils.clip_grad_norm_'s: min(1, max_norm / (norm + 1e-6)).
        """
        for work in adamw_works + [work for _, _, work in muon_chunks]:
            work.wait()
        outs = adamw_outs + [out for _, out, _ in muon_chunks]
        sumsq = torch.stack([o.float().pow(2).sum() for o in outs]).sum()
        dist.all_reduce(sumsq, group=self.process_group)
        coef = self._clip_coefficient(sumsq.sqrt() / (1 if self._native_avg else self.world_size))
        for o in outs:
            o.mul_(coef.to(o.dtype))

    # ------------------------------------------------------------------------------------------ steps
    def _clip_coefficient(self, norm: Tensor) -> Tensor:
        """Record the global gradient norm; torch's clipping coefficient min(1, max_norm / (norm + 1e-6))."""
        self.last_grad_norm = norm.item()
        return torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0)

    def _step_local(self) -> None:
        if self.max_grad_norm > 0:
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            coef = self._clip_coefficient(torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt())
            for g in grads:
                g.mul_(coef.to(g.dtype))
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["kind"] == "adamw":
                for p in params:
                    st = self._adamw_state(p, p.shape[0])
                    st["step"] += 1
                    adamw_update(
                        p,
                        p.grad,
                        st["exp_avg"],
                        st["exp_avg_sq"],
                        step=st["step"],
                        lr=group["lr"],
                        betas=group["betas"],
                        eps=group["eps"],
                        weight_decay=group["weight_decay"],
                    )
                continue
            for bucket in _shape_buckets(params):
                muon_update(
                    bucket, [p.grad for p in bucket], [self._muon_buf(p) for p in bucket], **_muon_options(group)
                )

    def _step_sharded(self) -> None:
        world, rank, pg = self.world_size, self.rank, self.process_group
        # 1. launch every gradient reduce-scatter
        adamw_jobs, muon_jobs = [], []
        for group in self.param_groups:
            if group["kind"] == "adamw":
                for p in group["params"]:
                    adamw_jobs.append((group, p, *self._reduce_scatter_rows(p)))
                continue
            for bucket in _shape_buckets(group["params"]):
                chunks = []
                for c0 in range(0, len(bucket), world):
                    chunk = bucket[c0 : c0 + world]
                    grads = [self._grad(p) for p in chunk]
                    grads += [torch.zeros_like(grads[0])] * (world - len(chunk))
                    stacked = torch.stack(grads).flatten(0, 1)  # (W*rows, cols): gloo scatters along dim 0
                    out = torch.empty_like(grads[0])
                    chunks.append((chunk, out, self._reduce_scatter(out, stacked)))
                muon_jobs.append((group, chunks))
        if self.max_grad_norm > 0:
            self._clip_reduced(
                [out for _, _, out, _ in adamw_jobs],
                [c for _, chunks in muon_jobs for c in chunks],
                [work for *_, work in adamw_jobs],
            )
            adamw_jobs = [(group, p, out, _Done()) for group, p, out, _ in adamw_jobs]
            muon_jobs = [(group, [(c, out, _Done()) for c, out, _ in chunks]) for group, chunks in muon_jobs]
        gathers: list[tuple[Any, Callable[[], Any] | None]] = []
        # 2. AdamW on this rank's rows, then all-gather the parameter
        for group, p, out, work in adamw_jobs:
            work.wait()
            gathers.append(self._adamw_rows_step(group, p, self._averaged(out)))
        # 3. Muon on the matrices this rank owns (one batched Newton-Schulz per bucket), then all-gather them
        for group, chunks in muon_jobs:
            owned, grads = [], []
            for chunk, out, work in chunks:
                work.wait()
                if rank < len(chunk):
                    owned.append(chunk[rank])
                    grads.append(self._averaged(out))
            muon_update(owned, grads, [self._muon_buf(p) for p in owned], **_muon_options(group))
            for chunk, out, _ in chunks:
                src = chunk[rank] if rank < len(chunk) else out  # a padding rank sends scratch, dropped below
                outputs = list(chunk) + [torch.empty_like(out) for _ in range(world - len(chunk))]
                gathers.append((dist.all_gather(outputs, src, group=pg, async_op=True), None))
        # 4. wait for every parameter to be complete again
        for work, finish in gathers:
            work.wait()
            if finish is not None:
                finish()
