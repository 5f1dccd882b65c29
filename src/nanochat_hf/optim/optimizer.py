"""One torch Optimizer holding nanochat's Muon and AdamW groups, with an optional sharded step (ZeRO-2).

Single process: Muon (Newton-Schulz batched over same-shaped matrices where that is faster) + AdamW (float32 moments).
torch.distributed initialised with world size W > 1: the optimizer does all gradient communication itself
(``reduces_gradients`` is True, so the caller must NOT all-reduce gradients), through `reduction.GradientReducer`:
- AdamW: each gradient is reduce-scattered (averaged) along dim 0, rank r owns rows [r*k, (r+1)*k) with k = ceil(n/W)
  (dim 0 is zero-padded to k*W when W does not divide it), keeps moments for those rows only, updates them and
  all-gathers the parameter.
- Muon: within each (group, shape) bucket parameter i is owned by rank i % W; its gradient is reduced to the owner
  (the others drop theirs), the owner alone keeps the momentum and runs Newton-Schulz (batched over everything it
  owns in the bucket), then every chunk of W parameters is all-gathered.
- Muon on a 3-D stack of MoE experts (E, out, in): a stack of E matrices, each orthogonalised on its own (batched
  with the group's other matrices of its shape). Rank r owns experts [r*k, (r+1)*k), k = ceil(E/W), exactly as
  AdamW rows (reduce-scatter along dim 0, momentum for those experts only, all-gather of the parameter).
- A Muon group with ``"split": (period, sizes)`` (``split_fused``, a fused projection): each block of rows is a
  matrix of its own (`_blocks`), on the owner's whole matrix, so the ownership above is unchanged.
Which ZeRO stage, measured (benchmarks/optim_memory.py, docs/distributed.md): optimizer state 1/W per rank (ZeRO-1);
gradients 1/W per rank after backward when the reduction runs during backward (`reduce_during_backward`, which the
Trainer glue in integration/gradients.py turns on: ZeRO-2), else all of them until the step; parameters whole on
every rank (not ZeRO-3). Parameters sharded by FSDP2 (DTensors): the same layout, stepped by optim/fsdp.py.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import UserError
from .fsdp import adopt_fsdp, fsdp_step
from .kernels import adamw_update, muon_update
from .reduction import GradientReducer, rows_per_rank

_MUON_KEYS = ("lr", "momentum", "nesterov", "ns_steps")
_ADAMW_KEYS = ("lr", "betas", "eps", "weight_decay")


def _shape_buckets(params: list[Tensor]) -> list[list[Tensor]]:
    """Parameters grouped by shape, buckets in order of first appearance, params in group order."""
    buckets: dict[tuple[int, ...], list[Tensor]] = {}
    for p in params:
        buckets.setdefault(tuple(p.shape), []).append(p)
    return list(buckets.values())


def _matrices_2d(group: dict[str, Any]) -> list[Tensor]:
    """A Muon group's 2-D matrices (its 3-D expert stacks are stepped by rows, as AdamW parameters are)."""
    return [p for p in group["params"] if p.ndim == 2]


def _muon_per_matrix(group: dict[str, Any], params: list[Tensor], grads: list[Tensor], bufs: list[Tensor]) -> None:
    """`muon_update` of a group's matrices, each expert of a 3-D stack (a slice of dim 0) and, in a split group
    (``split``: (period, sizes), `_blocks`), each block of a fused projection a matrix of its own, batched with the
    other matrices of its shape. A split group with ``transposed`` (Conv1D weights, stored (in, out)) splits the
    (out, in) views. Updates reach the parameters and buffers through views, or are written back."""
    split = group.get("split")
    flip = bool(split) and group.get("transposed", False)
    buckets: dict[tuple[int, ...], tuple[list[Tensor], list[Tensor], list[Tensor]]] = {}
    written: list[tuple[Tensor, list[Tensor]]] = []  # (parameter or buffer, its blocks) to write back
    for p, g, buf in zip(params, grads, bufs):
        p, g, buf = (t.mT if flip else t for t in (p, g, buf))
        parts = [_blocks(t, split) if split else [t] for t in (p, g, buf)]
        written += [(p, parts[0]), (buf, parts[2])] if split else []
        for blocks in zip(*parts):
            for views in zip(*(b.unbind(0) if b.ndim == 3 else (b,) for b in blocks)):
                for bucket, view in zip(buckets.setdefault(tuple(views[0].shape), ([], [], [])), views):
                    bucket.append(view)
    for ps, gs, bs in buckets.values():
        muon_update(ps, gs, bs, **_muon_options(group))
    for t, blocks in written:
        _unblock(t, blocks, split)


def _blocks(t: Tensor, split: Any) -> list[Tensor]:
    """The row blocks of ``t`` (..., R, C) that a split group orthogonalises as matrices of their own; ``split`` =
    (period, sizes): in every ``period`` rows, block i holds the ``sizes[i]`` rows after the earlier blocks'. Views
    when one period covers the rows, copies otherwise (`_unblock` writes them back)."""
    period, sizes = split
    rows = t.unflatten(-2, (t.shape[-2] // period, period))
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [rows.narrow(-2, o, s).flatten(-3, -2) for o, s in zip(offsets, sizes)]


def _unblock(t: Tensor, blocks: list[Tensor], split: Any) -> None:
    """Write `_blocks` of ``t`` back into it (nothing to do for views of it)."""
    period, sizes = split
    rows = t.unflatten(-2, (t.shape[-2] // period, period))
    offset = 0
    for block, size in zip(blocks, sizes):
        target = rows.narrow(-2, offset, size)
        if block.data_ptr() != target.data_ptr():
            target.copy_(block.unflatten(-2, (rows.shape[-3], size)))
        offset += size


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


def _adamw_update(group: dict[str, Any], st: dict[str, Any], p: Tensor, grad: Tensor) -> None:
    """`adamw_update` of ``p`` (a parameter or this rank's rows of it) with its group's settings and state ``st``."""
    adamw_update(
        p,
        grad,
        st["exp_avg"],
        st["exp_avg_sq"],
        step=st["step"],
        lr=group["lr"],
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
    )


class MuonAdamW(torch.optim.Optimizer):
    """Muon for hidden matrices plus AdamW for embedding/unembedding, in one optimizer (see module docstring).

    Every param group needs ``kind`` ("muon" or "adamw"), ``name``, ``lr`` and ``initial_lr``; Muon groups
    also ``momentum``, ``nesterov``, ``ns_steps``; AdamW groups ``betas``, ``eps``, ``weight_decay``.
    Muon groups may set ``ns_batch_size`` (matrices per batched Newton-Schulz; default: by device and shape),
    ``ns_gram`` (see :meth:`set_newton_schulz`) and ``polar_dtype`` (the orthogonalisation's dtype by name;
    default "bfloat16", nanochat's December choice; `build_optimizer` always sets it, see optim/precision.py).
    Use :func:`routing.build_optimizer` to get nanochat's grouping.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        process_group: Any = None,
        sharded: bool | None = None,
        grads_averaged: bool = False,
    ):
        for i, group in enumerate(param_groups):
            kind = group.get("kind")
            if kind not in ("muon", "adamw"):
                raise ValueError(f"param group {i}: 'kind' must be 'muon' or 'adamw', got {kind!r}")
            required = ("name", "initial_lr") + (_MUON_KEYS if kind == "muon" else _ADAMW_KEYS)
            missing = [k for k in required if k not in group]
            if missing:
                raise ValueError(f"param group {i} ({kind}): missing {missing}")
            if kind == "muon":
                bad = [tuple(p.shape) for p in group["params"] if p.ndim not in (2, 3)]
                if bad:
                    raise ValueError(
                        f"param group {group['name']!r}: Muon needs 2-D matrices or 3-D expert stacks, got shapes {bad}"
                    )
        super().__init__(param_groups, defaults={})
        self.process_group = process_group
        if sharded is None:  # auto: shard whenever several processes train together
            sharded = dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1
        self.world_size = dist.get_world_size(process_group) if sharded else 1
        self.rank = dist.get_rank(process_group) if sharded else 0
        # True: the gradients reach the step already averaged across ranks (by a DDP that could not be silenced),
        # so the sharded step only takes this rank's pieces and communicates no gradient
        self.grads_averaged = grads_averaged
        # Clip the (averaged) gradient to this global norm in step() (0: off), at every world size with the same
        # formula: sqrt of the sum of squares. torch.nn.utils.clip_grad_norm_'s fp32 vector_norm differs from it
        # by up to ~1e-4 relative on CPU, so clipping outside the optimizer would make 1 and W processes differ.
        self.max_grad_norm = 0.0
        self.last_grad_norm: float | None = None  # pre-clip norm of the averaged gradient, when clipping
        if self.world_size > 1:
            self._native_rs = self._probe_reduce_scatter()
            # AVG is only relied upon where it is native (NCCL, which serves CUDA tensors also in a mixed
            # "cpu:gloo,cuda:nccl" group); elsewhere SUM then divide, which is exact for W = 2^k.
            on_cuda = self.param_groups[0]["params"][0].is_cuda
            self._native_avg = self._native_rs and on_cuda and "nccl" in str(dist.get_backend(process_group))
            self._reducer = GradientReducer(self)
        self.fsdp_mesh = None  # FSDP2 parameters: their mesh, and the step of optim/fsdp.py
        adopt_fsdp(self)

    @property
    def reduces_gradients(self) -> bool:
        """True when this optimizer averages the gradients across ranks itself (the caller must not)."""
        adopt_fsdp(self)
        return self.world_size > 1 and not self.grads_averaged

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

    def reduce_during_backward(
        self,
        is_last: Callable[[], bool] = lambda: True,
        skip: tuple[Tensor, ...] = (),
        model_order: tuple[Tensor, ...] = (),
    ) -> None:
        """ZeRO-2: reduce each gradient onto its owner while backward still runs, and free the pieces this rank
        does not own (optim/reduction.py). ``is_last()`` says whether the running backward is the last micro-batch
        of the accumulation (only then is anything reduced; the Trainer's ``accelerator.sync_gradients``); the
        default suits one backward per step. ``skip``: parameters reduced at the step instead (one whose gradient
        DDP still writes after the hooks). ``model_order``: ``tuple(model.parameters())``, so that the first step
        already reduces in about backward's order (later steps use the order measured on rank 0). Without this call
        every gradient is reduced at the step. No-op with one process or when the gradients arrive averaged."""
        if self.reduces_gradients:
            self._reducer.hook_into_backward(is_last, skip, model_order)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        adopt_fsdp(self)
        if self.fsdp_mesh is not None:
            fsdp_step(self)
        elif self.world_size == 1:
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

    def _muon_buf(self, p: Tensor, rows: int | None = None) -> Tensor:
        """p's momentum; ``rows``: of an expert stack, the experts this rank owns (default: all of dim 0)."""
        st = self.state[p]
        if not st:
            shape = (p.shape[0] if rows is None else rows, *p.shape[1:])
            st["momentum_buffer"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
        return st["momentum_buffer"]

    def _rows(self, p: Tensor) -> tuple[int, int, int]:
        """(k, start, end): rows per rank (dim 0 padded to k*W) and this rank's real rows [start, end)."""
        return rows_per_rank(p.shape[0], self.world_size, self.rank)

    def _plan(self, p: Tensor) -> tuple:
        """Where p's averaged gradient goes (reduction.py): ("rows",) for AdamW and Muon expert stacks (their rows
        are experts), ("owner", i % W) for the Muon matrix i of its (group, shape) bucket."""
        if not hasattr(self, "_owners"):
            self._owners = {
                q: i % self.world_size
                for group in self.param_groups
                if group["kind"] == "muon"
                for bucket in _shape_buckets(_matrices_2d(group))
                for i, q in enumerate(bucket)
            }
        return ("owner", self._owners[p]) if p in self._owners else ("rows",)

    def _update_owned(
        self, group: dict[str, Any], owned: list[Tensor], values: list[Tensor], grads: list[Tensor]
    ) -> None:
        """Muon on the whole matrices this rank owns in one bucket (optim/fsdp.py): ``values`` and ``grads`` are
        their gathered values (updated in place) and gradients; the state is ``owned``'s."""
        _muon_per_matrix(group, values, grads, [self._muon_buf(p) for p in owned])

    def _update_local_experts(
        self, group: dict[str, Any], stacks: list[Tensor], experts: list[Tensor], grads: list[Tensor]
    ) -> None:
        """Muon on this rank's experts of each 3-D stack (optim/fsdp.py): ``experts`` are the stacks' local rows
        (updated in place), ``grads`` their gradients; the state is ``stacks``'."""
        bufs = [self._muon_buf(p, e.shape[0]) for p, e in zip(stacks, experts)]
        _muon_per_matrix(group, experts, grads, bufs)

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

    def _adamw(self, group: dict[str, Any], p: Tensor, grad: Tensor) -> None:
        """AdamW on the whole parameter (one process, or one every rank keeps whole)."""
        st = self._adamw_state(p, p.shape[0])
        st["step"] += 1
        _adamw_update(group, st, p, grad)

    def _adamw_rows_step(self, group: dict[str, Any], p: Tensor, grad: Tensor) -> tuple[Any, Callable[[], Any] | None]:
        """AdamW on this rank's rows of p (``grad``: their averaged gradient), then launch the all-gather of p:
        returns (work, what to run once it is done)."""
        _, start, end = self._rows(p)
        st = self._adamw_state(p, end - start)
        st["step"] += 1
        if end > start:
            _adamw_update(group, st, p[start:end], grad[: end - start])
        return self._gather_rows(p)

    def _gather_rows(self, p: Tensor) -> tuple[Any, Callable[[], Any] | None]:
        """Launch the all-gather of p from every rank's rows: returns (work, what to run once it is done)."""
        world, rank, pg = self.world_size, self.rank, self.process_group
        k, start, end = self._rows(p)
        if k * world == p.shape[0]:  # in place: our rows already sit at our offset of p
            return dist.all_gather_single(p, p[start:end], group=pg, async_op=True), None
        full = p.new_empty((k * world, *p.shape[1:]))
        mine = full[rank * k : (rank + 1) * k]
        mine[: end - start] = p[start:end]
        work = dist.all_gather_single(full, mine, group=pg, async_op=True)
        return work, lambda p=p, full=full: p.copy_(full[: p.shape[0]])

    def _reduced_pieces(self) -> dict[Tensor, Tensor]:
        """This rank's averaged gradient pieces (reduction.py), clipped to max_grad_norm when it is set.

        The ranks' pieces are disjoint except a replicated ("whole") one, counted on rank 0 only, so the global norm
        is the square root of the all-reduced sum of their squares; the coefficient is
        torch.nn.utils.clip_grad_norm_'s: min(1, max_norm / (norm + 1e-6))."""
        pieces = self._reducer.finish(averaged=self.grads_averaged)
        if self.max_grad_norm > 0:
            counted = [  # in parameter order: the same sum whatever order the pieces were reduced in
                pieces[p]
                for p in self._reducer.params
                if p in pieces and (self.rank == 0 or self._plan(p)[0] != "whole")
            ]
            sumsq = torch.stack([g.float().pow(2).sum() for g in counted]).sum() if counted else None
            if sumsq is None:
                sumsq = torch.zeros((), device=self.param_groups[0]["params"][0].device)
            dist.all_reduce(sumsq, group=self.process_group)
            coef = self._clip_coefficient(sumsq.sqrt())
            for g in pieces.values():
                g.mul_(coef.to(g.dtype))
        return pieces

    @staticmethod
    def _wait_gathers(gathers: list[tuple[Any, Callable[[], Any] | None]]) -> None:
        """Wait for every parameter's all-gather, then run what completes it."""
        for work, finish in gathers:
            work.wait()
            if finish is not None:
                finish()

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
                    self._adamw(group, p, p.grad)
                continue
            _muon_per_matrix(group, params, [p.grad for p in params], [self._muon_buf(p) for p in params])

    def _step_sharded(self) -> None:
        world, rank, pg = self.world_size, self.rank, self.process_group
        pieces = self._reduced_pieces()  # 1. this rank's averaged gradient pieces (most reduced during backward)
        gathers: list[tuple[Any, Callable[[], Any] | None]] = []
        for group in self.param_groups:
            if group["kind"] == "adamw":  # 2. AdamW on this rank's rows, then all-gather the parameter
                for p in group["params"]:
                    gathers.append(self._adamw_rows_step(group, p, pieces.pop(p)))
                continue
            # 3. Muon on the experts this rank owns (its rows of each stack), then all-gather each stack
            stacks = [p for p in group["params"] if p.ndim == 3]
            if stacks:
                rows = [self._rows(p)[1:] for p in stacks]
                _muon_per_matrix(
                    group,
                    [p[start:end] for p, (start, end) in zip(stacks, rows)],
                    [pieces.pop(p)[: end - start] for p, (start, end) in zip(stacks, rows)],
                    [self._muon_buf(p, end - start) for p, (start, end) in zip(stacks, rows)],
                )
                gathers.extend(self._gather_rows(p) for p in stacks)
            # 4. Muon on the matrices this rank owns (one batched Newton-Schulz per bucket), then all-gather each
            # chunk of W matrices (matrix i of the bucket from rank i % W)
            for bucket in _shape_buckets(_matrices_2d(group)):
                owned = bucket[rank::world]
                _muon_per_matrix(group, owned, [pieces.pop(p) for p in owned], [self._muon_buf(p) for p in owned])
                for c0 in range(0, len(bucket), world):
                    chunk = bucket[c0 : c0 + world]
                    scratch = [torch.empty_like(chunk[0]) for _ in range(world - len(chunk))]
                    src = chunk[rank] if rank < len(chunk) else scratch[0]  # a padding rank sends scratch
                    gathers.append((dist.all_gather(list(chunk) + scratch, src, group=pg, async_op=True), None))
        self._wait_gathers(gathers)  # 5. every parameter complete again
