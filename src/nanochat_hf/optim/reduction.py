"""Gradient reduction of the sharded optimizers (ZeRO-2): every gradient goes to the rank(s) that own it, and the
pieces a rank does not own are freed, during backward (hooks) or at the step.

Each trainable parameter is one unit of communication ("bucket of one"), by the owner the optimizer's layout gives
it (`MuonAdamW._plan`); the layout is the one the optimizer-state files record, unchanged:
- ``("owner", r)`` (a Muon matrix): ``reduce`` to rank r; r keeps the averaged gradient in ``p.grad``, the others
  drop theirs. A reduce-scatter whose whole output goes to one rank.
- ``("rows",)`` (an AdamW parameter): reduce-scatter along dim 0 (zero-padded to k*W rows, k = ceil(n/W)) into this
  rank's k rows; ``p.grad`` is dropped on every rank, the rows are kept beside it.
- ``("whole",)`` (a replicated small parameter of recipe 2026-07): all-reduce, every rank keeps it.

During backward (`GradientReducer.hook_into_backward`): a post-accumulate-grad hook marks a parameter's gradient
final; on the last micro-batch of an accumulation (``is_last()``, the Trainer's ``accelerator.sync_gradients``) the
units are launched in one fixed order that every rank shares (collectives must match across ranks), a unit as soon as
it and every unit before it are final. The order: reverse model order for the first step (DDP's first guess too),
then the order the hooks fired in on rank 0 during that first backward (broadcast from rank 0 at the first step, as
DDP rebuilds its buckets after its first iteration). Before launching the next unit the previous one is waited for
and its freed gradient released, so at most one unit is in flight beyond what a rank owns. Whatever was not launched
in backward (every unit when no hooks are set, a parameter whose hook is skipped, the units after it in the order)
is launched at the step, in the same order.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor


class _SliceWork:
    """Async handle for the all-reduce fallback of reduce-scatter: on wait, copy this rank's slice out."""

    def __init__(self, work: Any, full: Tensor, out: Tensor, rank: int, world: int):
        self.work, self.full, self.out, self.rank, self.world = work, full, out, rank, world

    def wait(self) -> None:
        self.work.wait()
        self.out.copy_(self.full.chunk(self.world)[self.rank])


def rows_per_rank(n: int, world: int, rank: int) -> tuple[int, int, int]:
    """(k, start, end): rows per rank (dim 0 padded to k*W) and ``rank``'s real rows [start, end) of n rows."""
    k = -(-n // world)
    start = min(rank * k, n)
    return k, start, min(start + k, n)


class GradientReducer:
    """Averages the gradients of ``optimizer``'s parameters onto their owners (module docstring).

    ``optimizer`` supplies the layout (``_plan(p)``), ``world_size``, ``rank``, ``process_group`` and the backend's
    abilities (``_native_rs``: reduce_scatter_single exists; ``_native_avg``: ReduceOp.AVG may be used).
    """

    def __init__(self, optimizer: Any):
        self.opt = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.index = {p: i for i, p in enumerate(self.params)}
        self.order = list(range(len(self.params)))  # the launch order, the same on every rank
        self.learning = False  # True until the first step after hooking: the hooks' order is recorded
        self.is_last: Callable[[], bool] | None = None  # set by hook_into_backward
        self.handles: list[Any] = []
        self._reset()

    def _reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.fired: list[int] = []  # indices in the order their hooks fired (learning the order)
        self.next = 0  # position in self.order of the next unit to launch
        self.launched: list[tuple[Tensor, Any, Tensor | None, Callable[[], Tensor | None]]] = []
        self.pieces: dict[Tensor, Tensor] = {}

    # ------------------------------------------------------------------------------------------------ backward
    def hook_into_backward(
        self, is_last: Callable[[], bool], skip: tuple[Tensor, ...] = (), model_order: tuple[Tensor, ...] = ()
    ) -> None:
        """Reduce during backward, on the backward passes where ``is_last()`` is True (the last micro-batch of each
        accumulation: the others accumulate locally). ``skip``: parameters whose gradient someone else finalises
        after the hooks run (DDP's copy-back), reduced at the step instead. ``model_order``: the parameters in the
        model's order (``model.parameters()``), whose reverse is the first step's guess of backward's order (else
        the reverse of the param groups' order)."""
        self.is_last = is_last
        for handle in self.handles:
            handle.remove()
        hooked = [i for i, p in enumerate(self.params) if p.requires_grad and not any(p is s for s in skip)]
        self.handles = [self.params[i].register_post_accumulate_grad_hook(self._on_final) for i in hooked]
        # until the hooks' order is known: reverse model order (what DDP starts its buckets with), the parameters
        # without a hook last
        guess = [self.index[p] for p in model_order[::-1] if p in self.index] or list(range(len(self.params)))[::-1]
        guess += [i for i in range(len(self.params))[::-1] if i not in set(guess)]
        self.order = [i for i in guess if i in set(hooked)] + [i for i in guess if i not in set(hooked)]
        self.learning = True

    def _on_final(self, p: Tensor) -> None:
        if not self.is_last():
            return
        i = self.index[p]
        self.ready[i] = True
        if self.learning:
            self.fired.append(i)
        while self.next < len(self.order) and self.ready[self.order[self.next]]:
            self._wait_all()  # at most one unit in flight: the previous one is done before the next starts
            self._launch(self.params[self.order[self.next]])
            self.next += 1

    # ---------------------------------------------------------------------------------------------------- step
    def finish(self, averaged: bool = False) -> dict[Tensor, Tensor]:
        """This rank's averaged pieces, by parameter: its rows of a "rows" parameter, the whole gradient of a
        replicated one and of every Muon matrix it owns. ``averaged``: the gradients already are (someone else
        averaged them), so the pieces are taken locally, nothing is communicated."""
        if averaged:
            pieces = {}
            for p in self.params:
                piece = self._local_piece(p)
                if piece is not None:
                    pieces[p] = piece
            return pieces
        for i in self.order[self.next :]:  # what backward did not launch, in the same order on every rank
            self._launch(self.params[i])
        self._wait_all()
        pieces = self.pieces
        if self.learning:
            self.order = self._learned_order()
            self.learning = False
        self._reset()
        return pieces

    def _learned_order(self) -> list[int]:
        """Rank 0's hook order of the first backward, then the units it saw no hook of, in the current order."""
        seen = set(self.fired)
        mine = self.fired + [i for i in self.order if i not in seen]
        order = torch.tensor(mine, dtype=torch.int64, device=self.params[0].device)
        pg = self.opt.process_group
        dist.broadcast(order, 0 if pg is None else dist.get_global_rank(pg, 0), group=pg)
        return order.tolist()

    # --------------------------------------------------------------------------------------------- one unit
    def _local_piece(self, p: Tensor) -> Tensor | None:
        kind, *arg = self.opt._plan(p)
        grad = checked_grad(p)
        if kind == "rows":
            _, start, end = rows_per_rank(p.shape[0], self.opt.world_size, self.opt.rank)
            return grad[start:end]
        return grad if kind == "whole" or arg[0] == self.opt.rank else None

    def _op(self) -> Any:
        return dist.ReduceOp.AVG if self.opt._native_avg else dist.ReduceOp.SUM

    def _launch(self, p: Tensor) -> None:
        """Start p's reduction; its gradient (kept alive by the record until the wait) is dropped from p now on
        the ranks that will not own it."""
        opt, world, pg = self.opt, self.opt.world_size, self.opt.process_group
        kind, *arg = opt._plan(p)
        grad = checked_grad(p)
        if kind == "owner":
            owner = arg[0]
            dst = owner if pg is None else dist.get_global_rank(pg, owner)
            work = dist.reduce(grad, dst, op=self._op(), group=pg, async_op=True)
            if owner != opt.rank:
                p.grad = None
            self.launched.append((p, work, grad, (lambda g=grad: g) if owner == opt.rank else (lambda: None)))
        elif kind == "whole":
            work = dist.all_reduce(grad, op=self._op(), group=pg, async_op=True)
            self.launched.append((p, work, grad, lambda g=grad: g))
        else:
            k, start, end = rows_per_rank(p.shape[0], world, opt.rank)
            full = grad
            if k * world != p.shape[0]:
                full = grad.new_zeros((k * world, *grad.shape[1:]))
                full[: p.shape[0]] = grad
            out = grad.new_empty((k, *grad.shape[1:]))
            p.grad = None
            self.launched.append((p, self._reduce_scatter(out, full), full, lambda o=out, n=end - start: o[:n]))

    def _reduce_scatter(self, out: Tensor, full: Tensor) -> Any:
        """Async reduce-scatter of ``full`` (W*len(out) along dim 0) into ``out``."""
        if self.opt._native_rs:
            return dist.reduce_scatter_single(out, full, op=self._op(), group=self.opt.process_group, async_op=True)
        # Fallback (older gloo builds): all-reduce the whole tensor and keep our slice, about twice the traffic
        full = full.clone()
        work = dist.all_reduce(full, op=self._op(), group=self.opt.process_group, async_op=True)
        return _SliceWork(work, full, out, self.opt.rank, self.opt.world_size)

    def _wait_all(self) -> None:
        """Wait for every launched unit, average what this rank keeps, release the rest."""
        for p, work, _, piece in self.launched:
            work.wait()
            kept = piece()
            if kept is not None:
                self.pieces[p] = kept if self.opt._native_avg else kept.div_(self.opt.world_size)
        self.launched = []


def checked_grad(p: Tensor) -> Tensor:
    if p.grad is None:  # every rank must join every collective, so a missing gradient cannot be skipped
        raise RuntimeError(f"sharded optimizer step: a parameter of shape {tuple(p.shape)} has no gradient")
    if not p.grad.is_contiguous():
        p.grad = p.grad.contiguous()
    return p.grad
