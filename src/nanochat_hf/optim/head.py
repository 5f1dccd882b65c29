"""The optimizer recipe "2026-07": nanochat HEAD's MuonAdamW (92d63d4, nanochat/optim.py and gpt.py setup_optimizer).

Same optimizer object as the December recipe (`MuonAdamW`, this is a subclass of it), other groups and another step:
- AdamW groups by parameter name, each with its own betas and weight decay (`routing.head_param_groups`); the update is
  the December kernel `adamw_update` (float32 moments and arithmetic).
- one Muon group per matrix shape, sorted by shape, stepped as one stack by `normuon_update` (Polar Express,
  MuonEq, Muon+, NorMuon, cautious weight decay). Its state lives on the group's first parameter, as nanochat keeps
  it: ``momentum_buffer`` (n, r, c) and ``second_momentum_buffer`` (n, r, 1) or (n, 1, c), float32.
One code path for 1 and W processes, with nanochat's layout (so that its optimizer files map onto ours rank by rank):
- Muon stack of K matrices: rank r owns the contiguous chunk [r*k, (r+1)*k), k = ceil(K/W) (stack zero-padded to
  k*W); its gradients are reduce-scattered, the owner steps them and keeps their state, the stack is all-gathered.
- AdamW parameter with at least 1024 elements: rows sharded as in the December recipe (reduce-scatter, moments
  for this rank's rows, all-gather). Smaller ones (the scalars): gradient all-reduced, every rank updates the whole
  parameter and keeps its whole state.
With several processes the optimizer does all gradient communication (``reduces_gradients``), like the December one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .kernels import adamw_update, normuon_update
from .optimizer import MuonAdamW, _Done

RECIPES = ("2025-12", "2026-07")  # the optimizer recipes: nanochat of December 2025 (G0) and nanochat HEAD
SMALL_NUMEL = 1024  # AdamW parameters below this size are replicated, not sharded (nanochat's threshold)


class NorMuonAdamW(MuonAdamW):
    """`MuonAdamW` with nanochat HEAD's groups and step (module docstring); build it with `routing.build_optimizer`.

    Muon groups must hold same-shaped matrices and also set ``beta2``, ``weight_decay`` and ``polar_dtype`` (a
    torch dtype's name).
    """

    def __init__(self, param_groups: list[dict[str, Any]], process_group: Any = None, sharded: bool | None = None):
        for group in param_groups:
            shapes = {tuple(p.shape) for p in group["params"]}
            if group.get("kind") == "muon" and len(shapes) > 1:
                raise ValueError(
                    f"param group {group.get('name')!r}: a Muon group of recipe 2026-07 is one stack "
                    f"of same-shaped matrices, got shapes {sorted(shapes)}"
                )
        super().__init__(param_groups, process_group=process_group, sharded=sharded)

    def _step_local(self) -> None:
        self._step_head()

    def _step_sharded(self) -> None:
        self._step_head()

    # ------------------------------------------------------------------------------------------- step
    def _muon_chunk(self, group: dict[str, Any]) -> tuple[int, int, int]:
        """(k, start, end): matrices per rank and this rank's matrices [start, end) of the group's stack."""
        n = len(group["params"])
        k = -(-n // self.world_size)
        start = min(self.rank * k, n)
        return k, start, min(start + k, n)

    def _muon_state(self, group: dict[str, Any]) -> dict[str, Tensor]:
        p = group["params"][0]
        st = self.state[p]
        if not st:
            k, _, _ = self._muon_chunk(group)
            rows, cols = p.shape
            st["momentum_buffer"] = torch.zeros((k, rows, cols), dtype=torch.float32, device=p.device)
            st["second_momentum_buffer"] = torch.zeros(
                (k, rows, 1) if rows >= cols else (k, 1, cols), dtype=torch.float32, device=p.device
            )
        return st

    def _replicated(self, p: Tensor) -> bool:
        return self.world_size == 1 or p.numel() < SMALL_NUMEL

    def _step_head(self) -> None:
        world, pg = self.world_size, self.process_group
        # 1. launch every gradient reduction (nothing to reduce with one process)
        adamw_jobs, muon_jobs = [], []
        for group in self.param_groups:
            if group["kind"] == "adamw":
                for p in group["params"]:
                    if world == 1:
                        adamw_jobs.append((group, p, self._grad(p), _Done()))
                    elif self._replicated(p):
                        grad = self._grad(p).clone()
                        op = dist.ReduceOp.AVG if self._native_avg else dist.ReduceOp.SUM
                        adamw_jobs.append((group, p, grad, dist.all_reduce(grad, op=op, group=pg, async_op=True)))
                    else:
                        adamw_jobs.append((group, p, *self._reduce_scatter_rows(p)))
                continue
            params = group["params"]
            grads = torch.stack([self._grad(p) for p in params])
            if world == 1:
                muon_jobs.append((group, grads, _Done()))
                continue
            k, _, _ = self._muon_chunk(group)
            stacked = grads.new_zeros((k * world, *grads.shape[1:]))
            stacked[: len(params)] = grads
            out = grads.new_empty((k, *grads.shape[1:]))
            muon_jobs.append((group, out, self._reduce_scatter(out.flatten(0, 1), stacked.flatten(0, 1))))
        # 2. averaged gradients (and clipped to max_grad_norm, which needs all of them first)
        for job in adamw_jobs + muon_jobs:
            job[-1].wait()
        reduced = [job[-2] for job in adamw_jobs + muon_jobs]
        if world > 1:
            reduced = [self._averaged(g) for g in reduced]
        if self.max_grad_norm > 0:
            self._clip_head(adamw_jobs, reduced)
        # 3. AdamW, then Muon on the matrices this rank owns, launching the all-gathers
        gathers = []
        for (group, p, _, _), grad in zip(adamw_jobs, reduced):
            if self._replicated(p):
                st = self._adamw_state(p, p.shape[0])
                st["step"] += 1
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
            else:
                gathers.append(self._adamw_rows_step(group, p, grad))
        for (group, _, _), grad in zip(muon_jobs, reduced[len(adamw_jobs) :]):
            params = group["params"]
            k, start, end = self._muon_chunk(group)
            st = self._muon_state(group)
            owned = params[start:end]
            normuon_update(
                owned,
                grad[: end - start],
                st["momentum_buffer"][: end - start],
                st["second_momentum_buffer"][: end - start],
                lr=group["lr"],
                momentum=group["momentum"],
                beta2=group["beta2"],
                weight_decay=group["weight_decay"],
                ns_steps=group["ns_steps"],
                dtype=getattr(torch, group["polar_dtype"]),
            )
            if world > 1:
                mine = grad.new_zeros((k, *grad.shape[1:]))
                if owned:
                    mine[: end - start] = torch.stack(owned)
                full = grad.new_empty((k * world, *grad.shape[1:]))
                work = dist.all_gather_single(full.flatten(0, 1), mine.flatten(0, 1), group=pg, async_op=True)
                gathers.append(
                    (
                        work,
                        lambda params=params, full=full: torch._foreach_copy_(
                            params, list(full[: len(params)].unbind(0))
                        ),
                    )
                )
        # 4. wait for every parameter to be complete again
        for work, finish in gathers:
            work.wait()
            if finish is not None:
                finish()

    def _clip_head(self, adamw_jobs: list, reduced: list[Tensor]) -> None:
        """Scale the averaged gradients so that their global norm is at most max_grad_norm (torch's coefficient).

        The ranks' sharded pieces are disjoint (padding is zero); a replicated gradient is counted on rank 0 only.
        """
        parts = [g.float().pow(2).sum() for g in reduced[len(adamw_jobs) :]]
        for (_, p, _, _), g in zip(adamw_jobs, reduced):
            if not self._replicated(p) or self.world_size == 1 or self.rank == 0:
                parts.append(g.float().pow(2).sum())
        sumsq = torch.stack(parts).sum()
        if self.world_size > 1:
            dist.all_reduce(sumsq, group=self.process_group)
        coef = self._clip_coefficient(sumsq.sqrt())
        for g in reduced:
            g.mul_(coef.to(g.dtype))
