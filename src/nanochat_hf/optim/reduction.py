"""Gradient reduction of the sharded optimizers (ZeRO-2): every gradient goes to the rank(s) that own it, and the
pieces a rank does not own are freed, during backward (hooks) or at the step.

Each trainable parameter is a unit of communication with the owner the optimizer's layout gives it
(`MuonAdamW._plan`); the layout is the one the optimizer-state files record, unchanged:
- ``("owner", r)`` (a Muon matrix): ``reduce`` to rank r; r keeps the averaged gradient in ``p.grad``, the others
  drop theirs. A reduce-scatter whose whole output goes to one rank.
- ``("rows",)`` (an AdamW parameter): reduce-scatter along dim 0 (zero-padded to k*W rows, k = ceil(n/W)) into this
  rank's k rows; ``p.grad`` is dropped on every rank, the rows are kept beside it.
- ``("whole",)`` (a replicated small parameter of recipe 2026-07): all-reduce, every rank keeps it.

Buckets, as DDP's: consecutive units of the launch order are grouped until the next would pass `BUCKET_BYTES`
(a unit larger than that is a bucket of its own), and a bucket is sent with one collective per kind (and dtype): one
``reduce`` of a flat buffer per owner, one ``reduce_scatter`` of a buffer laid out so that each rank receives exactly
its rows of each parameter (rank r's segment: its k rows of every parameter, one after the other), one
``all_reduce``. The values are those of the unit-by-unit reduction: each element is summed over the same W addends
(with W = 2 in any order the same bits; with W > 2 gloo may add them in another order, as before: within a float32
rounding). A bucket's lone unit that needs no padding is sent from its gradient itself, without a copy.

During backward (`GradientReducer.hook_into_backward`): a post-accumulate-grad hook marks a parameter's gradient
final; on the last micro-batch of an accumulation (``is_last()``, the Trainer's ``accelerator.sync_gradients``) the
buckets are launched in one fixed order that every rank shares (collectives must match across ranks), a bucket as
soon as its units and every bucket before it are final. The order: reverse model order for the first step (DDP's
first guess too), then the order the hooks fired in on rank 0 during that first backward (broadcast from rank 0 at
the first step, as DDP rebuilds its buckets after its first iteration). At most `MAX_IN_FLIGHT` buckets are in
flight: before another is launched the oldest is waited for and the gradients it freed are released, so during
backward a rank holds at most that many buckets' flat copies beyond what it owns, plus the final gradients of the
bucket not yet complete. Once the hooks have launched every bucket they will, they wait for all of them: backward
ends with exactly this rank's averaged pieces (a Muon matrix's in ``p.grad`` on its owner), nothing in flight.
Whatever was not launched in backward (every bucket when no hooks are set, a parameter whose hook is skipped, the
buckets after it in the order; a bucket never mixes hooked and skipped units) is launched at the step, in the same
order.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

# DDP's default bucket_cap_mb (25): few enough collectives that a model of thousands of parameters pays little
# per-call latency, small enough that the first buckets overlap with the rest of backward.
BUCKET_BYTES = 25 * 2**20
# Buckets in flight at once: gloo runs 2 collectives of a process group at a time (its 2 worker threads), NCCL
# queues them on one stream; more would only hold more flat copies.
MAX_IN_FLIGHT = 2


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


def _flat(grads: list[Tensor]) -> Tensor:
    """The gradients one after the other in one 1-D buffer (a lone gradient: a view of it, no copy)."""
    return grads[0].view(-1) if len(grads) == 1 else torch.cat([g.view(-1) for g in grads])


def _split(flat: Tensor, shapes: list[torch.Size]) -> list[Tensor]:
    """Views of ``flat`` shaped as `_flat`'s gradients were."""
    return [piece.view(shape) for piece, shape in zip(flat.split([s.numel() for s in shapes]), shapes)]


class GradientReducer:
    """Averages the gradients of ``optimizer``'s parameters onto their owners (module docstring).

    ``optimizer`` supplies the layout (``_plan(p)``), ``world_size``, ``rank``, ``process_group`` and the backend's
    abilities (``_native_rs``: reduce_scatter_single exists; ``_native_avg``: ReduceOp.AVG may be used).
    ``bucket_bytes``: the bucket size cap (0: every unit a bucket of its own).
    """

    def __init__(self, optimizer: Any, bucket_bytes: int = BUCKET_BYTES):
        self.opt = optimizer
        self.bucket_bytes = bucket_bytes
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.index = {p: i for i, p in enumerate(self.params)}
        self.hooked: set[int] = set()  # units whose gradient a hook reports final
        self._set_order(list(range(len(self.params))))  # the launch order, the same on every rank
        self.learning = False  # True until the first step after hooking: the hooks' order is recorded
        self.is_last: Callable[[], bool] | None = None  # set by hook_into_backward
        self.handles: list[Any] = []
        self._reset()

    def _set_order(self, order: list[int]) -> None:
        """The launch order and its buckets: consecutive units up to `bucket_bytes`, hooked and not apart."""
        self.order = order
        self.buckets: list[list[int]] = []
        size = 0
        for i in order:
            nbytes = self.params[i].numel() * self.params[i].element_size()
            last = self.buckets[-1] if self.buckets else None
            if last and size + nbytes <= self.bucket_bytes and (i in self.hooked) == (last[0] in self.hooked):
                last.append(i)
                size += nbytes
            else:
                self.buckets.append([i])
                size = nbytes

    def _reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.fired: list[int] = []  # indices in the order their hooks fired (learning the order)
        self.next = 0  # position in self.buckets of the next bucket to launch
        # the buckets in flight, oldest first: each its collectives as (work, buffer, what to run once done)
        self.in_flight: deque[list[tuple[Any, Tensor, Callable[[], None]]]] = deque()
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
        self.hooked = {i for i, p in enumerate(self.params) if p.requires_grad and not any(p is s for s in skip)}
        self.handles = [self.params[i].register_post_accumulate_grad_hook(self._on_final) for i in self.hooked]
        # until the hooks' order is known: reverse model order (what DDP starts its buckets with), the parameters
        # without a hook last
        guess = [self.index[p] for p in model_order[::-1] if p in self.index] or list(range(len(self.params)))[::-1]
        guess += [i for i in range(len(self.params))[::-1] if i not in set(guess)]
        self._set_order([i for i in guess if i in self.hooked] + [i for i in guess if i not in self.hooked])
        self.learning = True

    def _on_final(self, p: Tensor) -> None:
        if not self.is_last():
            return
        i = self.index[p]
        self.ready[i] = True
        if self.learning:
            self.fired.append(i)
        while self.next < len(self.buckets) and all(self.ready[j] for j in self.buckets[self.next]):
            self._launch(self.buckets[self.next])
            self.next += 1
        if self.next == len(self.buckets) or not self.hooked.issuperset(self.buckets[self.next]):
            self._wait_all()  # the hooks launched all they will: backward ends with the averaged pieces in place

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
        for bucket in self.buckets[self.next :]:  # what backward did not launch, in the same order on every rank
            self._launch(bucket)
        self._wait_all()
        pieces = self.pieces
        if self.learning:
            self._set_order(self._learned_order())
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

    # ------------------------------------------------------------------------------------------- one bucket
    def _local_piece(self, p: Tensor) -> Tensor | None:
        kind, *arg = self.opt._plan(p)
        grad = checked_grad(p)
        if kind == "rows":
            _, start, end = rows_per_rank(p.shape[0], self.opt.world_size, self.opt.rank)
            return grad[start:end]
        return grad if kind == "whole" or arg[0] == self.opt.rank else None

    def _op(self) -> Any:
        return dist.ReduceOp.AVG if self.opt._native_avg else dist.ReduceOp.SUM

    def _launch(self, bucket: list[int]) -> None:
        """Start the bucket's collectives, one per kind (module docstring), once fewer than `MAX_IN_FLIGHT` are in
        flight. Every gradient of the bucket is dropped from its parameter now; what this rank keeps comes back as
        views of the averaged buffers when the bucket is waited for."""
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            self._wait_oldest()
        kinds: dict[tuple, list[Tensor]] = {}
        for i in bucket:
            p = self.params[i]
            kinds.setdefault((self.opt._plan(p), checked_grad(p).dtype), []).append(p)
        collectives = []
        for (plan, _), params in kinds.items():  # the same order on every rank: the bucket's
            grads = [checked_grad(p) for p in params]
            for p in params:
                p.grad = None
            if plan[0] == "rows":
                collectives.append(self._reduce_rows(params, grads))
            else:
                collectives.append(self._reduce_whole(params, grads, plan[1] if plan[0] == "owner" else None))
        self.in_flight.append(collectives)

    def _reduce_whole(self, params: list[Tensor], grads: list[Tensor], owner: int | None) -> tuple:
        """One ``reduce`` of the flat gradients to ``owner``, or one ``all_reduce`` (``owner`` None)."""
        pg = self.opt.process_group
        flat = _flat(grads)
        if owner is None:
            work = dist.all_reduce(flat, op=self._op(), group=pg, async_op=True)
        else:
            dst = owner if pg is None else dist.get_global_rank(pg, owner)
            work = dist.reduce(flat, dst, op=self._op(), group=pg, async_op=True)
        if owner is not None and owner != self.opt.rank:
            return work, flat, lambda: None
        shapes = [g.shape for g in grads]

        def done() -> None:
            for p, piece in zip(params, _split(self._averaged(flat), shapes)):
                p.grad = piece
                self.pieces[p] = piece

        return work, flat, done

    def _reduce_rows(self, params: list[Tensor], grads: list[Tensor]) -> tuple:
        """One reduce-scatter: row r of the (W, S) buffer is rank r's k rows of every parameter, one after the
        other (each zero-padded to k*W rows), so this rank receives exactly its rows of each."""
        world, rank = self.opt.world_size, self.opt.rank
        spans = [rows_per_rank(p.shape[0], world, rank) for p in params]
        blocks = []
        for g, (k, _, _) in zip(grads, spans):
            rows = g.view(g.shape[0], -1)
            if k * world != g.shape[0]:
                rows = torch.cat([rows, rows.new_zeros(k * world - g.shape[0], rows.shape[1])])
            blocks.append(rows.view(world, -1))  # block r: rows [r*k, (r+1)*k), flattened
        full = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
        out = full.new_empty(full.shape[1])
        work = self._reduce_scatter(out, full.view(-1))
        shapes = [torch.Size((k, *p.shape[1:])) for p, (k, _, _) in zip(params, spans)]

        def done() -> None:
            for p, piece, (_, start, end) in zip(params, _split(self._averaged(out), shapes), spans):
                self.pieces[p] = piece[: end - start]

        return work, full, done

    def _averaged(self, summed: Tensor) -> Tensor:
        return summed if self.opt._native_avg else summed.div_(self.opt.world_size)

    def _reduce_scatter(self, out: Tensor, full: Tensor) -> Any:
        """Async reduce-scatter of ``full`` (W*len(out) along dim 0) into ``out``."""
        if self.opt._native_rs:
            return dist.reduce_scatter_single(out, full, op=self._op(), group=self.opt.process_group, async_op=True)
        # Fallback (older gloo builds): all-reduce the whole tensor and keep our slice, about twice the traffic
        full = full.clone()
        work = dist.all_reduce(full, op=self._op(), group=self.opt.process_group, async_op=True)
        return _SliceWork(work, full, out, self.opt.rank, self.opt.world_size)

    def _wait_oldest(self) -> None:
        """Wait for the oldest bucket in flight, keep this rank's averaged pieces, release the rest."""
        for work, _, done in self.in_flight.popleft():
            work.wait()
            done()

    def _wait_all(self) -> None:
        """Wait for every bucket in flight."""
        while self.in_flight:
            self._wait_oldest()


def checked_grad(p: Tensor) -> Tensor:
    if p.grad is None:  # every rank must join every collective, so a missing gradient cannot be skipped
        raise RuntimeError(f"sharded optimizer step: a parameter of shape {tuple(p.shape)} has no gradient")
    if not p.grad.is_contiguous():
        p.grad = p.grad.contiguous()
    return p.grad
