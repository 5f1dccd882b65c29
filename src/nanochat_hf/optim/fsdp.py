"""nanochat's optimizer on FSDP2-sharded parameters (``torch.distributed.fsdp.fully_shard``: DTensors, ``Shard(0)``).

FSDP2 hands the step each parameter's rows [start, end) of dim 0 (torch.chunk's split, `rows_per_rank`) and their
gradient already averaged (its reduce-scatter), so this step does no gradient reduction. The state layout is the
ZeRO-2 step's (`MuonAdamW._plan`), so a state file does not say which path wrote it:
- ``("rows",)`` AdamW parameter: the local shard IS this rank's rows; AdamW steps it in place, no communication.
- ``("owner", r)`` Muon matrix: updated whole on rank r by nanochat's exact rule (no per-shard approximation). Per
  (group, shape) bucket two ``all_to_all`` in total, whatever the number of matrices: one brings every rank's rows of
  the gradient and of the parameter (cautious weight decay reads it) to each matrix's owner, one sends the new rows
  back. The inbound ones of every bucket are launched first, the outbound ones as each bucket is done.
- ``("rows",)`` Muon stack of MoE experts (E, out, in): the local shard IS this rank's experts, each updated whole
  where it is, no communication.
- ``("whole",)`` small AdamW parameter (recipe 2026-07): every rank updates all of it; one all_gather for all of them.
Clipping: the squares of every rank's (disjoint) local gradient shards, one all_reduce, before anything moves.
microsoft/dion (megabatch_base.py, as issue 38 describes it) batches W matrices per pair of all_to_all and normalises
NorMuon per shard under FSDP; here a whole bucket rides in one all_to_all each way and NorMuon sees the whole matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

from ..errors import UserError
from .reduction import checked_grad, rows_per_rank


def fsdp_mesh(named_params: Iterable[tuple[str, Tensor]]) -> Any:
    """The device mesh of FSDP2-sharded parameters (None: plain tensors); refuses, in one line naming the parameter,
    a sharding the owner rule cannot handle (another dim than 0, a 2-D mesh such as HSDP, several meshes, a mix of
    sharded and plain tensors)."""
    named = list(named_params)
    sharded = [(name, p) for name, p in named if isinstance(p, DTensor)]
    if not sharded:
        return None
    if len(sharded) != len(named):
        name, p = next((n, p) for n, p in named if not isinstance(p, DTensor))
        raise UserError(
            f"{name}: a plain tensor of shape {tuple(p.shape)} among FSDP2-sharded parameters; apply fully_shard to "
            "the whole model (the root module too) before building nanochat's optimizer"
        )
    mesh = sharded[0][1].device_mesh
    for name, p in sharded:
        if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),) or p.device_mesh != mesh:
            raise UserError(
                f"{name}: sharded as {tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh; nanochat's optimizer "
                "needs FSDP2's default Shard(0) on one 1-D mesh (no shard_placement_fn, no HSDP): it gathers each "
                "Muon matrix whole by rows"
            )
        world, rank = mesh.size(), mesh.get_local_rank()
        _, start, end = rows_per_rank(p.shape[0], world, rank)
        if p.to_local().shape[0] != end - start:
            raise UserError(
                f"{name}: {p.to_local().shape[0]} rows on rank {rank}, expected rows [{start}, {end}) of "
                f"torch.chunk's split of {p.shape[0]} over {world} ranks"
            )
    return mesh


def adopt_fsdp(opt: Any) -> None:
    """Put ``opt`` on the FSDP2 step once its parameters are FSDP2 DTensors: built on a sharded model, or built on
    the whole model before Accelerate's FSDP2 sharded it and swapped the DTensors into the param groups (what the
    Trainer does under ``fsdp_version: 2``). The mesh gives the ranks; FSDP2 averaged the gradients."""
    if opt.fsdp_mesh is not None:
        return
    mesh = fsdp_mesh(_named_group_params(opt))
    if mesh is None:
        return
    opt.fsdp_mesh, opt.process_group = mesh, mesh.get_group()
    opt.world_size, opt.rank, opt.grads_averaged = mesh.size(), mesh.get_local_rank(), True
    opt.__dict__.pop("_owners", None)  # the Muon owners, cached by _plan for the parameters it was built with


def _named_group_params(opt: Any) -> Iterator[tuple[str, Tensor]]:
    """The parameters of ``opt``'s groups under their model names (``opt.routing``: build_optimizer's, attached
    after the constructor; its names are in each group's order), else by group and place."""
    routing = getattr(opt, "routing", None)
    routes = {r.group: r.names for r in routing.routes} if routing is not None else {}
    for g in opt.param_groups:
        names = routes.get(g["name"], ())
        for i, p in enumerate(g["params"]):
            yield (names[i] if len(names) == len(g["params"]) else f"parameter {i} of group {g['name']!r}"), p


def fsdp_step(opt: Any) -> None:
    """One step of ``opt`` (`MuonAdamW` or `NorMuonAdamW`, built on FSDP2 parameters): module docstring."""
    from .optimizer import _adamw_update, _matrices_2d, _shape_buckets  # here: optimizer.py imports this module

    world, rank, pg = opt.world_size, opt.rank, opt.process_group
    params = [p for group in opt.param_groups for p in group["params"]]
    grads = {p: checked_grad(p).to_local() for p in params}
    if opt.max_grad_norm > 0:
        local = [g.float().pow(2).sum() for g in grads.values()]
        sumsq = torch.stack(local).sum() if local else torch.zeros((), device=params[0].device)
        dist.all_reduce(sumsq, group=pg)
        coef = opt._clip_coefficient(sumsq.sqrt())
        for g in grads.values():
            g.mul_(coef.to(g.dtype))
    muon = [
        (group, bucket)
        for group in opt.param_groups
        if group["kind"] == "muon"
        for bucket in _shape_buckets(_matrices_2d(group))
    ]
    inbound = [_gather_to_owners(opt, bucket, grads) for _, bucket in muon]  # every bucket's gather in flight
    for group in opt.param_groups:  # MoE expert stacks: the local shard IS this rank's experts, no communication
        stacks = [p for p in group["params"] if group["kind"] == "muon" and p.ndim == 3]
        if stacks:
            opt._update_local_experts(group, stacks, [p.to_local() for p in stacks], [grads[p] for p in stacks])
    adamw = [(group, p) for group in opt.param_groups if group["kind"] == "adamw" for p in group["params"]]
    _step_whole(opt, [(group, p) for group, p in adamw if opt._plan(p)[0] == "whole"], grads)
    for group, p in adamw:
        if opt._plan(p)[0] == "rows":  # the local shard is this rank's rows: no communication
            _, start, end = rows_per_rank(p.shape[0], world, rank)
            st = opt._adamw_state(p, end - start)
            st["step"] += 1
            if end > start:
                _adamw_update(group, st, p.to_local(), grads[p])
    outbound = []
    for (group, bucket), (work, unpack) in zip(muon, inbound):
        work.wait()
        owned, fulls, full_grads = unpack()
        opt._update_owned(group, owned, fulls, full_grads)
        outbound.append(_scatter_from_owners(opt, bucket, fulls))
    for work, finish in outbound:
        work.wait()
        finish()


def _owned_by(opt: Any, bucket: list[Tensor]) -> list[list[Tensor]]:
    """For each rank, the matrices of ``bucket`` it owns, in bucket order."""
    owned: list[list[Tensor]] = [[] for _ in range(opt.world_size)]
    for p in bucket:
        owned[opt._plan(p)[1]].append(p)
    return owned


def _gather_to_owners(opt: Any, bucket: list[Tensor], grads: dict[Tensor, Tensor]) -> tuple[Any, Any]:
    """Launch the all_to_all that brings each matrix's rows (gradient, then parameter) to its owner. Returns (work,
    unpack), unpack() -> (owned parameters, their whole values, their whole gradients) once the work is done."""
    world, rank = opt.world_size, opt.rank
    rows, cols = bucket[0].shape
    owned = _owned_by(opt, bucket)
    dtype = bucket[0].dtype  # FSDP2 hands each gradient in its parameter's dtype
    spans = [rows_per_rank(rows, world, s)[1:] for s in range(world)]  # every rank's rows [start, end)
    send = [t.reshape(-1) for d in range(world) for p in owned[d] for t in (grads[p].to(dtype), p.to_local())]
    send_buf = torch.cat(send) if send else bucket[0].to_local().new_empty(0)
    held = spans[rank][1] - spans[rank][0]
    in_sizes = [2 * len(owned[d]) * held * cols for d in range(world)]
    out_sizes = [2 * len(owned[rank]) * (end - start) * cols for start, end in spans]
    recv = send_buf.new_empty(sum(out_sizes))
    work = dist.all_to_all_single(recv, send_buf, out_sizes, in_sizes, group=opt.process_group, async_op=True)

    def unpack() -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        n = len(owned[rank])
        # from rank s: (n matrices, gradient/parameter, its rows, cols); whole = the ranks' rows stacked in order
        parts = [part.view(n, 2, end - start, cols) for part, (start, end) in zip(recv.split(out_sizes), spans)]
        whole = torch.cat(parts, dim=2) if n else recv.new_empty((0, 2, rows, cols))
        return owned[rank], list(whole[:, 1]), list(whole[:, 0])

    return work, unpack


def _scatter_from_owners(opt: Any, bucket: list[Tensor], fulls: list[Tensor]) -> tuple[Any, Any]:
    """Launch the all_to_all that sends each owner's updated matrices' rows back to the ranks holding them. Returns
    (work, finish); finish() copies the received rows into this rank's shards."""
    world, rank = opt.world_size, opt.rank
    rows, cols = bucket[0].shape
    owned = _owned_by(opt, bucket)
    spans = [rows_per_rank(rows, world, s)[1:] for s in range(world)]
    send = [full[start:end].reshape(-1) for start, end in spans for full in fulls]
    send_buf = torch.cat(send) if send else bucket[0].to_local().new_empty(0)
    in_sizes = [len(fulls) * (end - start) * cols for start, end in spans]
    start, end = spans[rank]
    out_sizes = [len(owned[d]) * (end - start) * cols for d in range(world)]
    recv = send_buf.new_empty(sum(out_sizes))
    work = dist.all_to_all_single(recv, send_buf, out_sizes, in_sizes, group=opt.process_group, async_op=True)

    def finish() -> None:
        for d, part in enumerate(recv.split(out_sizes)):
            for p, new_rows in zip(owned[d], part.view(len(owned[d]), end - start, cols)):
                p.to_local().copy_(new_rows)

    return work, finish


def _step_whole(opt: Any, whole: list[tuple[dict[str, Any], Tensor]], grads: dict[Tensor, Tensor]) -> None:
    """AdamW on the replicated small parameters: one all_gather of every rank's rows of their gradients and values
    (float32, which holds either dtype exactly; padded to k rows each), then each rank updates every one whole and
    keeps its own rows."""
    if not whole:
        return
    from .optimizer import _adamw_update  # here: optimizer.py imports this module

    world, rank = opt.world_size, opt.rank
    pieces = []
    for _, p in whole:
        k, start, end = rows_per_rank(p.shape[0], world, rank)
        for t in (grads[p], p.to_local()):
            padded = t.new_zeros((k, *p.shape[1:]), dtype=torch.float32)
            padded[: end - start] = t
            pieces.append(padded)
    mine = torch.cat([t.reshape(-1) for t in pieces])
    gathered = mine.new_empty(world * mine.numel())
    dist.all_gather_single(gathered, mine, group=opt.process_group)
    # by_rank[s][j]: rank s's piece j
    by_rank = [row.split([t.numel() for t in pieces]) for row in gathered.view(world, -1)]

    def whole_tensor(j: int, p: Tensor) -> Tensor:  # piece j of every rank, its real rows, in rank order
        spans = [rows_per_rank(p.shape[0], world, s) for s in range(world)]
        rows = [by_rank[s][j].view(-1, *p.shape[1:])[: end - start] for s, (_, start, end) in enumerate(spans)]
        return torch.cat(rows).to(p.dtype)

    for i, (group, p) in enumerate(whole):
        full_grad, full = whole_tensor(2 * i, p), whole_tensor(2 * i + 1, p)
        st = opt._adamw_state(p, p.shape[0])
        st["step"] += 1
        _adamw_update(group, st, full, full_grad)
        _, start, end = rows_per_rank(p.shape[0], world, rank)
        p.to_local().copy_(full[start:end])
