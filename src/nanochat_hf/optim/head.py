"""The optimizer recipe "2026-07": nanochat HEAD's MuonAdamW (92d63d4, nanochat/optim.py and gpt.py setup_optimizer).

Same optimizer object as the December recipe (`MuonAdamW`, this is a subclass of it), other groups and another step:
- AdamW groups by parameter name, each with its own betas and weight decay (`routing.head_param_groups`); the update is
  the December kernel `adamw_update` (float32 moments and arithmetic).
- one Muon group per matrix shape, sorted by shape, stepped as one stack by `normuon_update` (Polar Express,
  MuonEq, Muon+, NorMuon, cautious weight decay). Its state lives on the group's first parameter, as nanochat keeps
  it: ``momentum_buffer`` (n, r, c) and ``second_momentum_buffer`` (n, r, 1) or (n, 1, c), float32.
With W processes, nanochat's layout (so that its optimizer files map onto ours rank by rank); one process steps
every stack whole, exactly as before:
- Muon stack of K matrices: rank r owns the contiguous chunk [r*k, (r+1)*k), k = ceil(K/W); each matrix's gradient
  is reduced to its owner (optim/reduction.py; the other ranks free theirs), the owner stacks and steps only its
  chunk and keeps its state, and the matrices are all-gathered straight into the parameters (k rounds, one matrix
  per rank each: no full-size stack of gradients or parameters on any rank).
- Muon group of 3-D expert stacks (E, out, in), one group per stack shape: every expert is a matrix of the stack
  (the group's L stacks step as one stack of L*E matrices, batched); rank r owns experts [r*k, (r+1)*k),
  k = ceil(E/W), of every stack, as AdamW rows (reduce-scatter along dim 0, all-gather of the parameter), and each
  stack holds its own state, those experts' rows: ``momentum_buffer`` (e, r, c), ``second_momentum_buffer``.
- a Muon group with ``"split": (period, sizes)`` (a fused projection, `routing.fused_splits`): every block of its
  matrices is a matrix of its own for Polar Express, Muon+, NorMuon (one ``second_momentum_buffer_<i>`` per block)
  and the rate's shape factor; the momentum is elementwise, stored whole.
- AdamW parameter with at least 1024 elements: rows sharded as in the December recipe (reduce-scatter, moments
  for this rank's rows, all-gather). Smaller ones (the scalars): gradient all-reduced, every rank updates the whole
  parameter and keeps its whole state.
With several processes the optimizer does all gradient communication (``reduces_gradients``), like the December one,
during backward once `reduce_during_backward` is on (ZeRO-2, docs/distributed.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .kernels import normuon_update
from .optimizer import MuonAdamW, _blocks, _unblock
from .reduction import checked_grad

RECIPES = ("2025-12", "2026-07")  # the optimizer recipes: nanochat of December 2025 (G0) and nanochat HEAD
SMALL_NUMEL = 1024  # AdamW parameters below this size are replicated, not sharded (nanochat's threshold)


class NorMuonAdamW(MuonAdamW):
    """`MuonAdamW` with nanochat HEAD's groups and step (module docstring); build it with `routing.build_optimizer`.

    Muon groups must hold same-shaped matrices and also set ``beta2``, ``weight_decay`` and ``polar_dtype`` (a
    torch dtype's name). A Muon group with ``"transposed": True`` (Conv1D weights, stored (in, out)) is stepped
    on the transposed views of its matrices, with its state shaped for them: exactly the step of the equivalent
    nn.Linear (out, in) weights.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        process_group: Any = None,
        sharded: bool | None = None,
        grads_averaged: bool = False,
    ):
        for group in param_groups:
            shapes = {tuple(p.shape) for p in group["params"]}
            if group.get("kind") == "muon" and len(shapes) > 1:
                raise ValueError(
                    f"param group {group.get('name')!r}: a Muon group of recipe 2026-07 is one stack "
                    f"of same-shaped matrices, got shapes {sorted(shapes)}"
                )
        super().__init__(param_groups, process_group=process_group, sharded=sharded, grads_averaged=grads_averaged)

    # ------------------------------------------------------------------------------------------- step
    def _muon_chunk(self, group: dict[str, Any]) -> tuple[int, int, int]:
        """(k, start, end): matrices per rank and this rank's matrices [start, end) of the group's stack."""
        n = len(group["params"])
        k = -(-n // self.world_size)
        start = min(self.rank * k, n)
        return k, start, min(start + k, n)

    @staticmethod
    def _second_moments(group: dict[str, Any]) -> list[str]:
        """The state keys of the group's NorMuon second moments: one, or one per block of a split group."""
        if group.get("split"):
            return [f"second_momentum_buffer_{i}" for i in range(len(group["split"][1]))]
        return ["second_momentum_buffer"]

    def _new_state(self, group: dict[str, Any], p: Tensor, n: int) -> dict[str, Tensor]:
        """Zero state for ``n`` matrices shaped as p's (2-D, or one expert of a 3-D stack), as the step sees them
        ((out, in) when ``transposed``): momentum (n, r, c), and per matrix (or block of a split group) the second
        moment along its larger dimension, (n, r, 1) or (n, 1, c)."""
        rows, cols = (p.mT if group.get("transposed") else p).shape[-2:]
        period, sizes = group.get("split") or (rows, [rows])
        st = {"momentum_buffer": torch.zeros((n, rows, cols), dtype=torch.float32, device=p.device)}
        for key, size in zip(self._second_moments(group), sizes):
            r = size * rows // period
            st[key] = torch.zeros((n, r, 1) if r >= cols else (n, 1, cols), dtype=torch.float32, device=p.device)
        return st

    def _muon_state(self, group: dict[str, Any]) -> dict[str, Tensor]:
        p = group["params"][0]
        st = self.state[p]
        if not st:
            st.update(self._new_state(group, p, self._muon_chunk(group)[0]))
        return st

    def _replicated(self, p: Tensor) -> bool:
        return self.world_size == 1 or p.numel() < SMALL_NUMEL

    def _plan(self, p: Tensor) -> tuple:
        """Where p's averaged gradient goes (reduction.py): matrix j of a Muon stack to rank j // k (the contiguous
        chunks of nanochat's layout), AdamW and expert stacks' rows sharded, the small AdamW parameters to every
        rank."""
        if not hasattr(self, "_owners"):
            self._owners, self._stacks = {}, set()
            for group in self.param_groups:
                if group["kind"] == "muon" and group["params"][0].ndim == 3:  # expert stacks: rows are experts
                    self._stacks.update(group["params"])
                elif group["kind"] == "muon":
                    k, _, _ = self._muon_chunk(group)
                    self._owners.update((q, j // k) for j, q in enumerate(group["params"]))
        if p in self._owners:
            return ("owner", self._owners[p])
        return ("whole",) if self._replicated(p) and p not in self._stacks else ("rows",)

    def _normuon_stack(
        self, group: dict[str, Any], matrices: list[Tensor], grads: Tensor, momentum: Tensor, seconds: list[Tensor]
    ) -> None:
        """`normuon_update` of same-shaped ``matrices`` (views written through), with the group's settings; in a
        split group each block (`_blocks`) as a stack of matrices of its own, written back after."""
        settings = {
            "lr": group["lr"],
            "momentum": group["momentum"],
            "beta2": group["beta2"],
            "weight_decay": group["weight_decay"],
            "ns_steps": group["ns_steps"],
            "dtype": getattr(torch, group["polar_dtype"]),
        }
        split = group.get("split")
        if not split:
            normuon_update(matrices, grads, momentum, seconds[0], **settings)
            return
        blocks, moments = [_blocks(m, split) for m in matrices], _blocks(momentum, split)
        for i, (g, m, second) in enumerate(zip(_blocks(grads, split), moments, seconds)):
            normuon_update([b[i] for b in blocks], g, m, second, **settings)
        for t, parts in zip([*matrices, momentum], [*blocks, moments]):
            _unblock(t, parts, split)

    def _normuon(self, group: dict[str, Any], owned: list[Tensor], grads: Tensor) -> None:
        """nanochat HEAD's Muon step on this rank's matrices ``owned`` of the group (``grads``: their stack)."""
        st = self._muon_state(group)
        n = len(owned)
        if group.get("transposed"):  # step the (out, in) views; normuon_update writes its result through them
            owned, grads = [p.mT for p in owned], grads.mT
        seconds = [st[key][:n] for key in self._second_moments(group)]
        self._normuon_stack(group, owned, grads[:n], st["momentum_buffer"][:n], seconds)

    def _normuon_experts(self, group: dict[str, Any], grads: list[Tensor], views: list[Tensor] | None = None) -> None:
        """nanochat HEAD's Muon step on this rank's experts of every stack of the group (rows [start, end) of dim
        0; ``grads``: their gradients, stack by stack), all of them as one stack of matrices; each stack keeps the
        state of its experts. ``views``: those experts' tensors (FSDP2's local shards), else slices of the stacks."""
        params = group["params"]
        rows = [self._rows(p)[1:] for p in params]
        states = []
        for p, (start, end) in zip(params, rows):
            if not self.state[p]:
                self.state[p].update(self._new_state(group, p, end - start))
            states.append(self.state[p])
        views = views or [p[start:end] for p, (start, end) in zip(params, rows)]
        stacked = torch.cat([g[: end - start] for g, (start, end) in zip(grads, rows)])
        if group.get("transposed"):  # the (out, in) views, as `_normuon` steps Conv1D weights
            views, stacked = [v.mT for v in views], stacked.mT
        keys = ["momentum_buffer", *self._second_moments(group)]
        joined = {key: torch.cat([st[key] for st in states]) for key in keys}
        matrices = [m for v in views for m in v.unbind(0)]
        self._normuon_stack(group, matrices, stacked, joined["momentum_buffer"], [joined[k] for k in keys[1:]])
        sizes = [end - start for start, end in rows]
        for key in keys:
            for st, part in zip(states, joined[key].split(sizes)):
                st[key].copy_(part)

    def _update_local_experts(
        self, group: dict[str, Any], stacks: list[Tensor], experts: list[Tensor], grads: list[Tensor]
    ) -> None:
        """NorMuon on this rank's experts of the group's stacks (optim/fsdp.py: their local shards)."""
        self._normuon_experts(group, grads, views=experts)

    def _update_owned(
        self, group: dict[str, Any], owned: list[Tensor], values: list[Tensor], grads: list[Tensor]
    ) -> None:
        """NorMuon on this rank's whole matrices of the group (optim/fsdp.py; the state is the group's, as always)."""
        if owned:
            self._normuon(group, values, torch.stack(grads))
        else:
            self._muon_state(group)

    def _step_local(self) -> None:
        """One process: every gradient whole, each Muon group stepped as one stack."""
        adamw = [
            (group, p, checked_grad(p))
            for group in self.param_groups
            if group["kind"] == "adamw"
            for p in group["params"]
        ]
        muon = [
            (g, torch.stack([checked_grad(p) for p in g["params"]])) for g in self.param_groups if g["kind"] == "muon"
        ]
        if self.max_grad_norm > 0:  # global norm: the Muon stacks' squares, then the AdamW ones
            grads = [g for _, g in muon] + [g for _, _, g in adamw]
            coef = self._clip_coefficient(torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt())
            for g in grads:
                g.mul_(coef.to(g.dtype))
        for group, p, grad in adamw:
            self._adamw(group, p, grad)
        for group, grads in muon:
            if grads.ndim == 4:  # a group of expert stacks
                self._normuon_experts(group, list(grads.unbind(0)))
            else:
                self._normuon(group, group["params"], grads)

    def _step_sharded(self) -> None:
        """W processes: this rank's averaged pieces (reduction.py), AdamW on its rows (or the whole replicated
        parameter), NorMuon on its chunk of each stack, then the parameters all-gathered."""
        world, pg = self.world_size, self.process_group
        pieces = self._reduced_pieces()
        gathers = []
        for group in self.param_groups:
            if group["kind"] == "adamw":
                for p in group["params"]:
                    if self._replicated(p):
                        self._adamw(group, p, pieces.pop(p))
                    else:
                        gathers.append(self._adamw_rows_step(group, p, pieces.pop(p)))
                continue
            params = group["params"]
            if params[0].ndim == 3:  # expert stacks: this rank's experts of each, then each stack all-gathered
                self._normuon_experts(group, [pieces.pop(p) for p in params])
                gathers.extend(self._gather_rows(p) for p in params)
                continue
            k, start, end = self._muon_chunk(group)
            owned = params[start:end]
            if owned:  # the only stack: this rank's k matrices, their gradients released as they are copied in
                grads = torch.stack([pieces.pop(p) for p in owned])
                for p in owned:
                    p.grad = None
                self._normuon(group, owned, grads)
            else:
                self._muon_state(group)
            # all-gather round i: every rank sends its i-th matrix straight into the parameters (no stacked copy)
            for i in range(k):
                scratch = [torch.empty_like(params[0]) for r in range(world) if r * k + i >= len(params)]
                outputs = [params[r * k + i] for r in range(world) if r * k + i < len(params)] + scratch
                src = params[start + i] if start + i < end else torch.empty_like(params[0])
                gathers.append((dist.all_gather(outputs, src, group=pg, async_op=True), None))
        self._wait_gathers(gathers)
