"""The optimizer recipe "2026-07": nanochat HEAD's MuonAdamW (92d63d4, nanochat/optim.py and gpt.py setup_optimizer).

Same optimizer object as the December recipe (`MuonAdamW`, this is a subclass of it), other groups and another step:
- AdamW groups by parameter name, each with its own betas and weight decay (`head_param_groups`); the update is
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

from ..errors import UserError
from .kernels import adamw_update, normuon_update
from .optimizer import SMEAR_PARAMS, MuonAdamW, generation_group
from .precision import polar_dtype_name, resolve_polar_dtype
from .reduction import checked_grad

RECIPES = ("2025-12", "2026-07")  # the optimizer recipes: nanochat of December 2025 (G0) and nanochat HEAD
SMALL_NUMEL = 1024  # AdamW parameters below this size are replicated, not sharded (nanochat's threshold)

# (group, lr from the rates, betas, weight decay): gpt.py setup_optimizer at 92d63d4, in its order and with its
# formulas; s = (n_embd/768)^-0.5 scales the embedding and unembedding rates.
ADAMW_GROUPS = (
    ("lm_head", lambda r: r["unembedding_lr"] * r["s"], (0.8, 0.96), 0.01),
    ("wte", lambda r: r["embedding_lr"] * r["s"], (0.8, 0.995), 0.001),
    ("value_embeds", lambda r: r["embedding_lr"] * r["s"] * 0.5, (0.8, 0.995), 0.01),
    ("resid_lambdas", lambda r: r["scalar_lr"] * 0.01, (0.8, 0.95), 0.05),
    ("x0_lambdas", lambda r: r["scalar_lr"], (0.96, 0.95), 0.0),
    ("smear", lambda r: 0.2, (0.8, 0.95), 0.0),
)
_BLOCK_ORDER = ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "attn.ve_gate", "mlp.c_fc", "mlp.c_proj")


def _nanochat_name(name: str) -> str:
    """nanochat's name of one of our parameters: our backbone ``transformer`` also holds the parameters nanochat
    keeps at the top level (``resid_lambdas``, ``value_embeds.*``, ``smear_gate.weight``, ...)."""
    key = name.removeprefix("module.").removeprefix("_orig_mod.")
    if key.startswith("transformer.") and not key.startswith(("transformer.h.", "transformer.wte.")):
        key = key.removeprefix("transformer.")
    return key


def head_group_of(name: str) -> str:
    """The HEAD recipe's group of a parameter, by nanochat's parameter name ("muon" for every block matrix)."""
    key = _nanochat_name(name)
    if key.startswith("transformer.h."):
        return "muon"
    if key == "transformer.wte.weight":
        return "wte"
    if key == "lm_head.weight":
        return "lm_head"
    group = generation_group(key)  # G1-G5's parameters beside the blocks: the same groups as in recipe 2025-12
    if group is not None:
        return group
    raise UserError(
        f"parameter {name!r} belongs to no optimizer group of recipe 2026-07: expected transformer.h.*, "
        f"transformer.wte.weight, lm_head.weight, value_embeds.*, resid_lambdas, x0_lambdas or "
        f"{', '.join(SMEAR_PARAMS)}"
    )


def nanochat_order(name: str) -> tuple[int, int]:
    """Sort key putting a group's parameters in the order nanochat's module tree lists them (layer, then position
    in the block; value embeddings by layer; smear_gate, smear_lambda, backout_lambda): which rank owns which matrix
    of a stack, and the parameter numbering of optimizer files, follow it."""
    parts = _nanochat_name(name).split(".")
    if parts[0] == "transformer" and parts[1] == "h":
        suffix = ".".join(parts[3:-1])
        return int(parts[2]), _BLOCK_ORDER.index(suffix) if suffix in _BLOCK_ORDER else len(_BLOCK_ORDER)
    if parts[0] == "value_embeds":
        return int(parts[1]), 0
    key = ".".join(parts)
    return (SMEAR_PARAMS.index(key), 0) if key in SMEAR_PARAMS else (0, 0)


def head_param_groups(
    model: torch.nn.Module,
    matrix_lr: float,
    embedding_lr: float,
    unembedding_lr: float,
    weight_decay: float,
    init_lr_frac: float,
    scalar_lr: float,
    polar_dtype: torch.dtype,
) -> list[dict[str, Any]]:
    """nanochat HEAD's param groups for the trainable parameters of ``model`` (empty groups left out). The Muon
    groups' ``polar_dtype`` is stored by name ("bfloat16"), so that the state dict stays JSON-able."""
    config = getattr(model, "config", None) or model.module.config  # model or a DDP-wrapped one
    s = ((getattr(config, "n_embd", None) or config.hidden_size) / 768) ** -0.5
    rates = {"unembedding_lr": unembedding_lr, "embedding_lr": embedding_lr, "scalar_lr": scalar_lr, "s": s}
    named: dict[str, list[tuple[str, Tensor]]] = {}
    for name, p in model.named_parameters():  # each parameter once, into exactly one group (or an error)
        if p.requires_grad:
            group = head_group_of(name)
            if group == "muon" and p.ndim != 2:
                raise UserError(f"parameter {name!r} has shape {tuple(p.shape)}: Muon expects 2-D block matrices")
            named.setdefault(group, []).append((name, p))
    members = {
        group: [p for _, p in sorted(items, key=lambda item: nanochat_order(item[0]))] for group, items in named.items()
    }
    groups = []
    for name, formula, betas, wd in ADAMW_GROUPS:
        if members.get(name):
            groups.append(
                {
                    "kind": "adamw",
                    "name": f"adamw/{name}",
                    "params": members[name],
                    "lr": formula(rates) * init_lr_frac,
                    "betas": betas,
                    "eps": 1e-10,
                    "weight_decay": wd,
                }
            )
    matrices = members.get("muon", [])
    for shape in sorted({tuple(p.shape) for p in matrices}):
        groups.append(
            {
                "kind": "muon",
                "name": f"muon/{shape[0]}x{shape[1]}",
                "params": [p for p in matrices if tuple(p.shape) == shape],
                "lr": matrix_lr * init_lr_frac,
                "momentum": 0.95,
                "nesterov": True,
                "ns_steps": 5,
                "beta2": 0.9,
                "weight_decay": weight_decay,
                "polar_dtype": polar_dtype_name(polar_dtype),
            }
        )
    for g in groups:
        g["initial_lr"] = g["lr"]
    return groups


class NorMuonAdamW(MuonAdamW):
    """`MuonAdamW` with nanochat HEAD's groups and step (module docstring); build it with `build_head_optimizer`.

    Muon groups must hold same-shaped matrices and also set ``beta2``, ``weight_decay`` and ``polar_dtype`` (a
    torch dtype's name).
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

    def _plan(self, p: Tensor) -> tuple:
        """Where p's averaged gradient goes (reduction.py): matrix j of a Muon stack to rank j // k (the contiguous
        chunks of nanochat's layout), AdamW rows sharded, the small AdamW parameters to every rank."""
        if not hasattr(self, "_owners"):
            self._owners = {}
            for group in self.param_groups:
                if group["kind"] == "muon":
                    k, _, _ = self._muon_chunk(group)
                    self._owners.update((q, j // k) for j, q in enumerate(group["params"]))
        if p in self._owners:
            return ("owner", self._owners[p])
        return ("whole",) if self._replicated(p) else ("rows",)

    def _adamw(self, group: dict[str, Any], p: Tensor, grad: Tensor) -> None:
        """AdamW on the whole parameter (one process, or a replicated one)."""
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

    def _normuon(self, group: dict[str, Any], owned: list[Tensor], grads: Tensor) -> None:
        """nanochat HEAD's Muon step on this rank's matrices ``owned`` of the group (``grads``: their stack)."""
        st = self._muon_state(group)
        n = len(owned)
        normuon_update(
            owned,
            grads[:n],
            st["momentum_buffer"][:n],
            st["second_momentum_buffer"][:n],
            lr=group["lr"],
            momentum=group["momentum"],
            beta2=group["beta2"],
            weight_decay=group["weight_decay"],
            ns_steps=group["ns_steps"],
            dtype=getattr(torch, group["polar_dtype"]),
        )

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


def build_head_optimizer(
    model: torch.nn.Module,
    matrix_lr: float = 0.02,
    embedding_lr: float = 0.2,
    unembedding_lr: float = 0.004,
    weight_decay: float = 0.0,
    init_lr_frac: float = 1.0,
    *,
    scalar_lr: float = 0.5,
    polar_dtype: str | torch.dtype = "auto",
    process_group: Any = None,
    sharded: bool | None = None,
) -> NorMuonAdamW:
    """nanochat HEAD's optimizer (recipe "2026-07") for a NanoChatGPT model of any generation, grouped by parameter
    name as gpt.py setup_optimizer groups them. ``weight_decay`` is the Muon groups' (the AdamW groups have
    nanochat's fixed ones); every group's lr and initial_lr are its base rate times ``init_lr_frac``.

    ``polar_dtype``: the dtype of the orthogonalisation; "auto" follows nanochat's compute dtype: bfloat16 when the
    parameters are on a CUDA device that supports it, else float32 (`precision.resolve_polar_dtype`). Sharded as
    `build_optimizer`.
    """
    polar_dtype, _ = resolve_polar_dtype(polar_dtype, next(model.parameters()).device, "2026-07")
    groups = head_param_groups(
        model, matrix_lr, embedding_lr, unembedding_lr, weight_decay, init_lr_frac, scalar_lr, polar_dtype
    )
    return NorMuonAdamW(groups, process_group=process_group, sharded=sharded)


def build_recipe_optimizer(
    recipe: str,
    model: torch.nn.Module,
    *rates: float,
    process_group: Any = None,
    sharded: bool | None = None,
    polar_dtype: str | torch.dtype = "auto",
) -> MuonAdamW:
    """`build_optimizer` for a ``recipe`` other than the default "2025-12" (``rates``: its five positional rates)."""
    if recipe not in RECIPES[1:]:
        raise ValueError(f"optimizer recipe {recipe!r}: expected one of {', '.join(RECIPES)}")
    return build_head_optimizer(model, *rates, process_group=process_group, sharded=sharded, polar_dtype=polar_dtype)
