"""Which optimizer and rate each trainable parameter gets: `build_optimizer`, for any transformers model.

Two layouts, decided once per model (`layout_of`):
- "nanochat": nanochat's own GPT (config.model_type "nanochat_gpt"), and a plain module without
  ``get_input_embeddings`` whose parameters carry nanochat's names (the stand-ins of the tests). Grouped by name
  exactly as nanochat groups them, in both recipes (`nanochat_groups`): the parity tests pin these bit for bit.
- "roles": any other model (a `PreTrainedModel`, PEFT- or DDP-wrapped or not), grouped by what each parameter
  does, never by its name (`role_of`):
    embedding  every nn.Embedding weight (get_input_embeddings(), position and value embeddings) -> AdamW at
               embedding_lr * s;
    head       get_output_embeddings().weight -> AdamW at unembedding_lr * s; when tied to the input embedding it
               is counted once, as the embedding, in a group "adamw/tied_embedding" at the head's rate and settings
               (the head's rate bounds how fast the logits move; the embedding rate would blow them up);
    matrix     a 2-D weight inside the repeated layers (an nn.ModuleList) -> Muon at matrix_lr;
    adapter    PEFT's LoRA adapters -> AdamW at the head's rate (a model training only adapters is all AdamW);
    scalar     everything else that is 0-D or 1-D (norm weights, biases) -> AdamW at the head's rate (the one
               AdamW rate nanochat tunes for ordinary weights);
  where s = (hidden_size/768)^-0.5. ``roles={glob: role}`` routes parameters by name where the rule above does
  not fit (a classifier head, stacked MoE experts). Decisions, with reasons, in docs/optimizer.md:
    - GPT-2's Conv1D stores (in, out), and a Conv1D weight moves exactly as the equivalent nn.Linear (out, in)
      weight in both recipes. Recipe 2025-12: Newton-Schulz does not care (orthogonalising a matrix or its
      transpose gives the transposed result), but the aspect-ratio factor max(1, rows/cols)^0.5 would read the
      shape backwards, so a non-square Conv1D weight gets its own Muon group whose rate carries the correction
      factor. Recipe 2026-07 reads the rows (MuonEq, NorMuon's second moment, the shape's rate scale), so every
      Conv1D weight gets its own group with ``"transposed": True``, which NorMuonAdamW steps as the (out, in) view;
    - fused projections (GPT-2's c_attn, Phi3's qkv_proj, ...) are orthogonalised whole, as nanochat does with its
      matrices, unless ``split_fused=True``: then each block (q, k, v; gate, up), read from the model's config,
      is a matrix of its own (`fused_splits`; groups "muon/.../split<period>:<sizes>" carry ``"split"``);
    - stacked 3-D expert weights (transformers 5's MoE experts modules: Mixtral, Qwen2-MoE, OLMoE, ...; a
      parameter (E, out, in) of a module with ``num_experts`` = E) are matrices: role "matrix", each expert
      orthogonalised on its own (`_expert_stacks`); stored (E, in, out) where the module says ``is_transposed``,
      they are handled as Conv1D weights are. Any other 3-D or larger parameter (a conv kernel) is refused;
    - LoRA adapters go to AdamW: their product is the update, and Muon would orthogonalise A and B separately
      (B starts at zero), which is not an orthogonalised update of the weight.
The routing is returned as data (`Routing`, on the optimizer as ``optimizer.routing``) and printed by the Trainer
glue as a table (`Routing.table`).
"""

from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from .head import NorMuonAdamW
from .optimizer import MuonAdamW
from .precision import polar_dtype_name, resolve_polar_dtype
from .settings import check_values

ROLES = ("embedding", "head", "matrix", "adapter", "scalar")
SCALAR_LR = 0.5  # nanochat's scalar_lr (setup_optimizers from aa530cd on)
SMEAR_PARAMS = ("smear_gate.weight", "smear_lambda", "backout_lambda")  # G5's, in nanochat's module order

# Recipe 2026-07's AdamW groups of nanochat's model: (group, lr from the rates, betas, weight decay), gpt.py
# setup_optimizer at 92d63d4, in its order and with its formulas; s = (n_embd/768)^-0.5.
ADAMW_GROUPS = (
    ("lm_head", lambda r: r["unembedding_lr"] * r["s"], (0.8, 0.96), 0.01),
    ("wte", lambda r: r["embedding_lr"] * r["s"], (0.8, 0.995), 0.001),
    ("value_embeds", lambda r: r["embedding_lr"] * r["s"] * 0.5, (0.8, 0.995), 0.01),
    ("resid_lambdas", lambda r: r["scalar_lr"] * 0.01, (0.8, 0.95), 0.05),
    ("x0_lambdas", lambda r: r["scalar_lr"], (0.96, 0.95), 0.0),
    ("smear", lambda r: 0.2, (0.8, 0.95), 0.0),
)
# Recipe 2026-07's settings for the roles of any other model: nanochat HEAD's lm_head and wte groups' betas and
# weight decay for head and embedding, its plain scalar settings for the rest.
ROLE_ADAMW_2026 = {
    "head": ((0.8, 0.96), 0.01),
    "embedding": ((0.8, 0.995), 0.001),
    "adapter": ((0.8, 0.95), 0.0),
    "scalar": ((0.8, 0.95), 0.0),
}
_BLOCK_ORDER = ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "attn.ve_gate", "mlp.c_fc", "mlp.c_proj")


@dataclass(frozen=True)
class Route:
    """One optimizer group as the user sees it: its name, optimizer, members (parameter names) and rate."""

    group: str
    kind: str
    names: tuple[str, ...]
    elements: int
    lr: float


@dataclass(frozen=True)
class Routing:
    """Where every trainable parameter went (one `Route` per param group, in the optimizer's order)."""

    layout: str  # "nanochat" or "roles"
    recipe: str
    routes: tuple[Route, ...]

    def group_of(self, name: str) -> str:
        """The group holding the parameter called ``name`` (as model.named_parameters() names it)."""
        for route in self.routes:
            if name in route.names:
                return route.group
        raise KeyError(name)

    def table(self) -> str:
        """A short table: group, optimizer, parameter count, elements, lr (the rate at build time)."""
        width = max(len("group"), *(len(r.group) for r in self.routes))
        lines = [
            f"optimizer recipe {self.recipe} ({self.layout} routing): "
            f"{sum(len(r.names) for r in self.routes)} trainable parameters in {len(self.routes)} groups",
            f"  {'group':<{width}}  optimizer  params     elements  lr",
        ]
        for r in self.routes:
            lines.append(f"  {r.group:<{width}}  {r.kind:<9}  {len(r.names):>6}  {r.elements:>11,}  {r.lr:.4g}")
        return "\n".join(lines)


def _inner(model: nn.Module) -> nn.Module:
    """The model inside DDP and torch.compile wrappers (a PEFT model stays itself: its parameters are its own)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _width(model: nn.Module) -> int:
    """The model's hidden width (n_embd, hidden_size or d_model; a multimodal model's text config's)."""
    config = _inner(model).config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in ("n_embd", "hidden_size", "d_model"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise UserError(f"model config {type(config).__name__} has no n_embd, hidden_size or d_model: the rates need it")


def _is_peft(model: nn.Module) -> bool:
    return type(model).__module__.startswith("peft.")


def layout_of(model: nn.Module) -> str:
    """The layout: "nanochat" for nanochat's model (or a plain module named like it), "roles" for any other."""
    inner = _inner(model)
    if _is_peft(inner):
        return "roles"
    if getattr(getattr(inner, "config", None), "model_type", None) == "nanochat_gpt":
        return "nanochat"
    return "roles" if hasattr(inner, "get_input_embeddings") else "nanochat"


def _muon_polar(polar_dtype: str | torch.dtype, model: nn.Module, recipe: str) -> str:
    return polar_dtype_name(resolve_polar_dtype(polar_dtype, next(model.parameters()).device, recipe)[0])


# ---- nanochat's own model, grouped by name ------------------------------------------------------------------------
def generation_group(key: str) -> str | None:
    """The AdamW group of a parameter of nanochat's later model generations (G1-G5) that sits beside the blocks
    (nanochat's name, or ours under ``transformer.``); None for the December model's parameters."""
    key = key.removeprefix("transformer.")
    if key.startswith("value_embeds."):
        return "value_embeds"
    if key in ("resid_lambdas", "x0_lambdas"):
        return key
    return "smear" if key in SMEAR_PARAMS else None


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


def december_param_groups(
    model: nn.Module,
    matrix_lr: float,
    embedding_lr: float,
    unembedding_lr: float,
    weight_decay: float,
    init_lr_frac: float,
    *,
    muon_momentum: float,
    ns_steps: int,
    betas: tuple[float, float],
    eps: float,
    matrix_optimizer: str,
    polar_dtype: str,
) -> list[dict[str, Any]]:
    """Recipe 2025-12's groups of nanochat's model: Muon on every ``transformer.h`` matrix, AdamW on ``lm_head`` and
    ``transformer.wte`` with rates scaled by (n_embd/768)^-0.5; a G1-G5 model's other parameters in AdamW groups with
    the December betas and weight decay, at the rates nanochat's setup_optimizers gave them while it had this
    optimizer (a91743c): value embeddings as wte, resid_lambdas 0.01 * SCALAR_LR, x0_lambdas SCALAR_LR; smear_gate,
    smear_lambda and backout_lambda (G5) 0.2 as at a825e63. The value-embedding gates (``ve_gate``, in the blocks)
    are matrices: Muon. ``matrix_optimizer="adamw"``: the block matrices in an AdamW group at ``matrix_lr``."""
    adamw_scale = (_width(model) / 768) ** -0.5
    matrices, wte, head = [], [], []
    later = {"value_embeds": [], "resid_lambdas": [], "x0_lambdas": [], "smear": []}  # G1-G5, in nanochat's order
    for name, p in model.named_parameters():  # each parameter once, into exactly one group (or an error)
        if not p.requires_grad:
            continue
        key = name.removeprefix("module.").removeprefix("_orig_mod.")
        if key.startswith("transformer.h."):
            if p.ndim != 2:
                raise UserError(f"parameter {name!r} has shape {tuple(p.shape)}: Muon expects 2-D block matrices")
            matrices.append(p)
        elif key == "transformer.wte.weight":
            wte.append(p)
        elif key == "lm_head.weight":
            head.append(p)
        elif (group := generation_group(key)) is not None:
            later[group].append(p)
        else:
            raise UserError(
                f"parameter {name!r} belongs to no optimizer group: expected transformer.h.*, "
                "transformer.wte.weight, lm_head.weight or a G1-G5 resid/x0 lambda, value embedding, "
                "smear or backout parameter"
            )
    adamw = {"kind": "adamw", "betas": betas, "eps": eps, "weight_decay": weight_decay}
    if matrix_optimizer == "muon":
        matrix_group = {
            "kind": "muon",
            "params": matrices,
            "name": "muon/matrix",
            "lr": matrix_lr * init_lr_frac,
            "momentum": muon_momentum,
            "nesterov": True,
            "ns_steps": ns_steps,
            "polar_dtype": polar_dtype,
        }
    else:
        matrix_group = {**adamw, "params": matrices, "name": "adamw/matrix", "lr": matrix_lr * init_lr_frac}
    later_lr = {
        "value_embeds": embedding_lr * adamw_scale,
        "resid_lambdas": 0.01 * SCALAR_LR,
        "x0_lambdas": SCALAR_LR,
        "smear": 0.2,
    }
    groups = [
        {**adamw, "params": head, "name": "adamw/lm_head", "lr": unembedding_lr * adamw_scale * init_lr_frac},
        {**adamw, "params": wte, "name": "adamw/wte", "lr": embedding_lr * adamw_scale * init_lr_frac},
        *({**adamw, "params": ps, "name": f"adamw/{g}", "lr": later_lr[g] * init_lr_frac} for g, ps in later.items()),
        matrix_group,
    ]
    return [g for g in groups if g["params"]]


def head_param_groups(
    model: nn.Module,
    matrix_lr: float,
    embedding_lr: float,
    unembedding_lr: float,
    weight_decay: float,
    init_lr_frac: float,
    scalar_lr: float,
    polar_dtype: str,
) -> list[dict[str, Any]]:
    """nanochat HEAD's param groups (recipe 2026-07) for the trainable parameters of nanochat's ``model`` (empty
    groups left out): AdamW groups by name with their own betas and weight decay (`ADAMW_GROUPS`), one Muon group
    per matrix shape, sorted by shape, members in nanochat's module order (`nanochat_order`)."""
    s = (_width(model) / 768) ** -0.5
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
            _head_muon_group(
                f"muon/{shape[0]}x{shape[1]}",
                [p for p in matrices if tuple(p.shape) == shape],
                matrix_lr * init_lr_frac,
                weight_decay,
                polar_dtype,
            )
        )
    return groups


def _head_muon_group(name: str, params: list[Tensor], lr: float, weight_decay: float, polar: str) -> dict[str, Any]:
    return {
        "kind": "muon",
        "name": name,
        "params": params,
        "lr": lr,
        "momentum": 0.95,
        "nesterov": True,
        "ns_steps": 5,
        "beta2": 0.9,
        "weight_decay": weight_decay,
        "polar_dtype": polar,
    }


# ---- any other model, grouped by role -----------------------------------------------------------------------------
def _is_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2 and relatives): a linear layer storing its weight as (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _is_lora(name: str) -> bool:
    """PEFT's adapter parameters (LoRA A/B, embedding A/B, DoRA magnitude), by PEFT's own naming of them."""
    return any(f".{key}" in f".{name}" for key in ("lora_A.", "lora_B.", "lora_embedding_", "lora_magnitude_vector"))


def _expert_stacks(inner: nn.Module) -> tuple[dict[int, bool], set[int]]:
    """({id: transposed} of every 3-D expert stack, {ids of the experts' per-expert bias stacks}): a parameter
    (E, out, in) of a module holding ``num_experts`` = E experts (transformers 5's MoE experts modules), stored
    (E, in, out) where the module says ``is_transposed`` (GPT-OSS); the same module's 2-D (E, out) parameters are
    biases, one row per expert. A router (num_experts too, but no 3-D parameter) keeps its 2-D weight a matrix."""
    stacks: dict[int, bool] = {}
    biases: set[int] = set()
    for module in inner.modules():
        n = getattr(module, "num_experts", None)
        own = list(module.parameters(recurse=False))
        if not isinstance(n, int) or not any(p.ndim == 3 and p.shape[0] == n for p in own):
            continue
        for p in own:
            if p.ndim == 3 and p.shape[0] == n:
                stacks[id(p)] = bool(getattr(module, "is_transposed", False))
            elif p.ndim == 2 and p.shape[0] == n:
                biases.add(id(p))
    return stacks, biases


def role_of(model: nn.Module, roles: dict[str, str] | None = None) -> dict[str, tuple[str, Tensor, bool]]:
    """name -> (role, parameter, transposed) for every trainable parameter of a model in the "roles" layout, in
    model.named_parameters() order. ``transposed``: a Conv1D weight, stored (in, out). Errors name the parameter."""
    roles = roles or {}
    for pattern, role in roles.items():
        if role not in ROLES:
            raise UserError(f"roles[{pattern!r}] = {role!r}: expected one of {', '.join(ROLES)}")
    inner = _inner(model)
    embeddings = {id(m.weight) for m in inner.modules() if isinstance(m, nn.Embedding)}
    if (emb := inner.get_input_embeddings()) is not None and getattr(emb, "weight", None) is not None:
        embeddings.add(id(emb.weight))
    out = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    head = getattr(out, "weight", None)
    head_id = id(head) if head is not None and id(head) not in embeddings else None  # tied: the embedding, once
    in_layers = {id(p) for m in inner.modules() if isinstance(m, nn.ModuleList) for p in m.parameters()}
    experts, expert_biases = _expert_stacks(inner)
    transposed = {id(m.weight) for m in inner.modules() if _is_conv1d(m)}
    transposed |= {i for i, t in experts.items() if t}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    for pattern in roles:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in trainable):
            raise UserError(
                f"roles glob {pattern!r} matches no trainable parameter (names read like {trainable[0]!r}): "
                "correct or remove it"
            )
    routed: dict[str, tuple[str, Tensor, bool]] = {}
    for name, p in model.named_parameters():  # tied parameters are listed once
        if not p.requires_grad:
            continue
        matched = [pattern for pattern in roles if fnmatch.fnmatchcase(name, pattern)]
        if len({roles[m] for m in matched}) > 1:
            raise UserError(f"parameter {name!r} matches roles {matched} with different roles: route it once")
        if matched:
            role = roles[matched[0]]
        elif id(p) in embeddings:
            role = "embedding"
        elif id(p) == head_id:
            role = "head"
        elif _is_lora(name):
            role = "adapter"
        elif p.ndim < 2 or id(p) in expert_biases:
            role = "scalar"
        elif (p.ndim == 2 and id(p) in in_layers) or id(p) in experts:
            role = "matrix"
        elif p.ndim > 2:
            raise UserError(
                f"parameter {name!r} has shape {tuple(p.shape)}: Muon takes 2-D matrices and stacks of MoE experts "
                f"(E, out, in) of a module with num_experts = E, not this; route it with roles={{{name!r}: 'scalar'}} "
                "(AdamW), or a glob"
            )
        else:
            raise UserError(
                f"parameter {name!r} {tuple(p.shape)} fits no role: a 2-D weight outside the repeated layers that is "
                f"neither an embedding nor get_output_embeddings(); route it with roles={{{name!r}: ...}}, one of "
                f"{', '.join(ROLES)}"
            )
        if role == "matrix" and p.ndim != 2 and id(p) not in experts:
            raise UserError(
                f"parameter {name!r} has shape {tuple(p.shape)}: the role 'matrix' (Muon) takes 2-D weights and "
                "stacks of MoE experts"
            )
        routed[name] = (role, p, id(p) in transposed)
    return routed


def _fused_split(module: nn.Module, leaf: str, p: Tensor, config: Any) -> tuple[int, tuple[int, ...]] | None:
    """(period, sizes) of a fused projection's weight, read from the model's config, or None for any other weight:
    along the output rows, every ``period`` rows hold the blocks' rows in turn, ``sizes[i]`` rows of block i (one
    period: q, k, v one after the other; a period per head or per KV group: interleaved layouts)."""
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if leaf == "qkv_proj" and p.ndim == 2:  # Phi3: q, k, v one after the other
        kv = getattr(config, "num_key_value_heads", None) or heads
        hd = getattr(config, "head_dim", None) or width // heads
        sizes = (heads * hd, kv * hd, kv * hd)
        return sum(sizes), sizes
    if leaf == "query_key_value" and p.ndim == 2:
        hd = width // heads
        if getattr(config, "model_type", "") == "falcon":
            if getattr(config, "new_decoder_architecture", False):  # per KV group: its query heads, k, v
                per = heads // config.num_kv_heads
                return (per + 2) * hd, (per * hd, hd, hd)
            if getattr(config, "multi_query", False):  # all queries, one k, one v
                return (heads + 2) * hd, (heads * hd, hd, hd)
        return 3 * hd, (hd, hd, hd)  # GPT-NeoX, Falcon without MQA/GQA: q, k, v per head
    if leaf == "c_attn" and _is_conv1d(module):  # GPT-2: stored (in, 3*width), q, k, v along the output
        return 3 * width, (width, width, width)
    if leaf == "gate_up_proj" and p.ndim in (2, 3):  # fused MLP / experts: gate and up halves, or interleaved
        rows = p.shape[-1] if getattr(module, "is_transposed", False) else p.shape[-2]
        if getattr(module, "is_concatenated", True):
            return rows, (rows // 2, rows // 2)
        return 2, (1, 1)
    return None


def fused_splits(model: nn.Module) -> dict[int, tuple[int, tuple[int, ...]]]:
    """{id(weight): (period, sizes)} of every fused projection of a model in the "roles" layout (`_fused_split`),
    checked against the weight's shape."""
    inner = _inner(model)
    config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    splits = {}
    for name, module in inner.named_modules():
        for key, p in module.named_parameters(recurse=False):  # a Linear's weight, or an experts module's stack
            leaf = name.rsplit(".", 1)[-1] if key == "weight" else key
            split = _fused_split(module, leaf, p, config) if key in ("weight", "gate_up_proj") else None
            if split is None:
                continue
            rows = p.shape[-1] if _is_conv1d(module) or getattr(module, "is_transposed", False) else p.shape[-2]
            period, sizes = split
            if sum(sizes) != period or rows % period:
                raise UserError(
                    f"split_fused: {name}.{key} has {rows} output rows, which the config's blocks {sizes} "
                    f"(every {period} rows) do not tile; train it whole (split_fused=False)"
                )
            splits[id(p)] = split
    return splits


def _conv1d_factor(shape: tuple[int, ...]) -> float:
    """Rate factor for a Conv1D weight stored (in, out): Muon's aspect-ratio scale of the real (out, in) matrix
    over the scale the step computes from the stored shape."""
    rows, cols = shape[-2:]
    return (max(1.0, cols / rows) / max(1.0, rows / cols)) ** 0.5


def role_param_groups(
    model: nn.Module,
    matrix_lr: float,
    embedding_lr: float,
    unembedding_lr: float,
    weight_decay: float,
    init_lr_frac: float,
    *,
    recipe: str,
    muon_momentum: float,
    ns_steps: int,
    betas: tuple[float, float],
    eps: float,
    matrix_optimizer: str,
    polar_dtype: str,
    roles: dict[str, str] | None,
    split_fused: bool = False,
) -> list[dict[str, Any]]:
    """The groups of a model in the "roles" layout (module docstring): adamw/lm_head, adamw/embedding, adamw/adapter,
    adamw/scalar,
    then the matrices: recipe 2025-12 one "muon/matrix" group and one "muon/experts" group of the expert stacks,
    2026-07 one group per shape ("muon/RxC", "muon/ExRxC/experts"); Conv1D weights (stored (in, out)) and
    transposed expert stacks in groups of their own ("muon/RxC/conv1d", "muon/ExRxC/experts/transposed"): in
    recipe 2025-12 the non-square ones, whose rate carries the orientation factor, in 2026-07 all of them, flagged
    ``transposed``. Each role's
    settings: the December betas/eps/weight decay, or HEAD's per group (`ROLE_ADAMW_2026`)."""
    routed = role_of(model, roles)
    if not routed:
        raise UserError("every parameter of the model is frozen (requires_grad=False): nothing to optimise")
    if not any(role in ("matrix", "adapter") for role, _, _ in routed.values()):
        raise UserError(
            "the model has no trainable 2-D weight inside its repeated layers (nn.ModuleList) and no adapter: "
            "nothing for Muon; route matrices with roles={glob: 'matrix'} or use an AdamW optimizer"
        )
    s = (_width(model) / 768) ** -0.5
    lrs = {"head": unembedding_lr * s, "embedding": embedding_lr * s}
    lrs["adapter"] = lrs["scalar"] = lrs["head"]
    inner = _inner(model)
    out = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    tied = getattr(out, "weight", None) is getattr(inner.get_input_embeddings(), "weight", False)
    by_role: dict[str, list[Tensor]] = {role: [] for role in (*ROLES, "tied")}
    for role, p, _ in routed.values():
        by_role["tied" if tied and p is out.weight else role].append(p)
    lrs["tied"] = lrs["head"]
    groups = []
    for role, group in (
        ("head", "adamw/lm_head"),
        ("tied", "adamw/tied_embedding"),
        ("embedding", "adamw/embedding"),
        ("adapter", "adamw/adapter"),
        ("scalar", "adamw/scalar"),
    ):
        if recipe == "2025-12":
            settings = {"betas": betas, "eps": eps, "weight_decay": weight_decay}
        else:
            role_betas, role_wd = ROLE_ADAMW_2026["head" if role == "tied" else role]
            settings = {"betas": role_betas, "eps": 1e-10, "weight_decay": role_wd}
        if by_role[role]:
            groups.append(
                {"kind": "adamw", "name": group, "params": by_role[role], "lr": lrs[role] * init_lr_frac, **settings}
            )
    # recipe 2025-12: a square Conv1D weight steps as any matrix (nothing in that step reads the orientation)
    # unless it is split; recipe 2026-07: every Conv1D weight is stepped transposed (MuonEq and NorMuon read the rows)
    december = recipe == "2025-12"
    splits = fused_splits(model) if split_fused else {}
    matrices = [
        (p, t and (p.shape[-2] != p.shape[-1] or not december or id(p) in splits), splits.get(id(p)))
        for role, p, t in routed.values()
        if role == "matrix"
    ]
    lr = matrix_lr * init_lr_frac
    if matrix_optimizer == "adamw":
        adamw = {"kind": "adamw", "betas": betas, "eps": eps, "weight_decay": weight_decay}
        return groups + [{**adamw, "name": "adamw/matrix", "params": [p for p, _, _ in matrices], "lr": lr}]
    shapes = sorted({(tuple(p.shape), t, split) for p, t, split in matrices}, key=lambda k: (*k[:2], k[2] or ()))
    if december:  # one group of the 2-D matrices, one of the expert stacks (stepped per expert), then the others
        for name, ndim in (("muon/matrix", 2), ("muon/experts", 3)):
            plain = [p for p, t, split in matrices if not t and not split and p.ndim == ndim]
            if plain:
                groups.append(
                    {
                        "kind": "muon",
                        "name": name,
                        "params": plain,
                        "lr": lr,
                        "momentum": muon_momentum,
                        "nesterov": True,
                        "ns_steps": ns_steps,
                        "polar_dtype": polar_dtype,
                    }
                )
        shapes = [(shape, t, split) for shape, t, split in shapes if t or split]
    for shape, t, split in shapes:
        members = [p for p, pt, ps in matrices if (tuple(p.shape), pt, ps) == (shape, t, split)]
        name = "muon/" + "x".join(map(str, shape))
        if len(shape) == 3:
            name += "/experts" + ("/transposed" if t else "")
        elif t:
            name += "/conv1d"
        if split:
            name += f"/split{split[0]}:" + "+".join(map(str, split[1]))
        if december:
            group = {
                "kind": "muon",
                "name": name,
                "params": members,
                "lr": lr * (_conv1d_factor(shape) if t and not split else 1.0),
                "momentum": muon_momentum,
                "nesterov": True,
                "ns_steps": ns_steps,
                "polar_dtype": polar_dtype,
            }
        else:
            group = _head_muon_group(name, members, lr, weight_decay, polar_dtype)
        if split:  # each block a matrix of its own, split along the (out, in) orientation
            group["split"] = [split[0], list(split[1])]
        if t and (split or not december):  # steps the (out, in) views: exactly the equivalent nn.Linear weights'
            group["transposed"] = True
        groups.append(group)
    return groups


# ---- the public entry -----------------------------------------------------------------------------------------------
def _routing(model: nn.Module, groups: list[dict[str, Any]], layout: str, recipe: str) -> Routing:
    """The groups as data; a trainable parameter in no group or in two is an error naming it."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            names.setdefault(id(p), name)
    seen: dict[int, str] = {}
    routes = []
    for g in groups:
        for p in g["params"]:
            if id(p) in seen:
                raise UserError(f"parameter {names.get(id(p), '?')!r} is in groups {seen[id(p)]!r} and {g['name']!r}")
            seen[id(p)] = g["name"]
        member_names = tuple(names.get(id(p), "?") for p in g["params"])
        elements = sum(p.numel() for p in g["params"])
        routes.append(Route(g["name"], g["kind"], member_names, elements, g["lr"]))
    missing = [n for i, n in names.items() if i not in seen]
    if missing:
        raise UserError(f"parameter {missing[0]!r} is in no optimizer group")
    return Routing(layout, recipe, tuple(routes))


def _param_groups(
    model: nn.Module,
    *,
    matrix_lr: float,
    embedding_lr: float,
    unembedding_lr: float,
    weight_decay: float,
    init_lr_frac: float,
    muon_momentum: float,
    ns_steps: int,
    betas: tuple[float, float],
    eps: float,
    matrix_optimizer: str,
    recipe: str,
    polar_dtype: str | torch.dtype,
    roles: dict[str, str] | None,
    split_fused: bool,
    scalar_lr: float = SCALAR_LR,
) -> tuple[list[dict[str, Any]], str]:
    """(param groups, layout) of build_optimizer's checked settings; every refusal of the routing is a UserError."""
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError("every parameter of the model is frozen (requires_grad=False): nothing to optimise")
    polar = _muon_polar(polar_dtype, model, recipe)
    rates = (matrix_lr, embedding_lr, unembedding_lr, weight_decay, init_lr_frac)
    layout = layout_of(model)
    if layout == "roles":
        groups = role_param_groups(
            model,
            *rates,
            recipe=recipe,
            muon_momentum=muon_momentum,
            ns_steps=ns_steps,
            betas=betas,
            eps=eps,
            matrix_optimizer=matrix_optimizer,
            polar_dtype=polar,
            roles=roles,
            split_fused=split_fused,
        )
    elif roles or split_fused:
        raise UserError(
            "roles= and split_fused= route parameters of other models; nanochat's model (no fused projections) is "
            "grouped as nanochat groups it"
        )
    elif recipe == "2025-12":
        groups = december_param_groups(
            model,
            *rates,
            muon_momentum=muon_momentum,
            ns_steps=ns_steps,
            betas=betas,
            eps=eps,
            matrix_optimizer=matrix_optimizer,
            polar_dtype=polar,
        )
    else:
        groups = head_param_groups(model, *rates, scalar_lr, polar)
    return groups, layout


def check_optimizer_settings(model: nn.Module, **settings: Any) -> None:
    """Refuse, in one `UserError` line, what ``build_optimizer(model, **settings)`` would refuse, without building
    it: an unknown setting, a wrong type or value (`settings.check_values`), an unknown recipe, and the routing's
    refusals (a roles glob that matches no trainable parameter, two globs routing one parameter differently, a
    parameter no role fits, nothing trainable). The Trainer glue calls it when the Trainer is built."""
    signature = inspect.signature(build_optimizer).parameters
    accepted = list(signature)[1:]  # all but the model
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise UserError(f"nanochat_optimizer: unknown {unknown}; build_optimizer takes {', '.join(accepted)}")
    settings = {k: settings.get(k, signature[k].default) for k in accepted if k != "process_group"}
    check_values(settings)
    settings.pop("sharded")
    _param_groups(model, **settings)


def build_optimizer(
    model: nn.Module,
    matrix_lr: float = 0.02,
    embedding_lr: float = 0.2,
    unembedding_lr: float = 0.004,
    weight_decay: float = 0.0,
    init_lr_frac: float = 1.0,
    *,
    muon_momentum: float = 0.95,
    ns_steps: int = 5,
    betas: tuple[float, float] = (0.8, 0.95),
    eps: float = 1e-10,
    process_group: Any = None,
    sharded: bool | None = None,
    matrix_optimizer: str = "muon",
    recipe: str = "2025-12",
    polar_dtype: str | torch.dtype = "auto",
    roles: dict[str, str] | None = None,
    split_fused: bool = False,
    scalar_lr: float = SCALAR_LR,
) -> MuonAdamW:
    """nanochat's optimizer for ``model``'s trainable parameters: a `MuonAdamW` (recipe "2025-12", nanochat of
    December 2025) or `NorMuonAdamW` ("2026-07", nanochat HEAD), grouped as the module docstring says; the routing
    is on the optimizer as ``optimizer.routing`` (`Routing`). ``model`` may be wrapped in DDP, torch.compile or PEFT.

    Every group has ``kind`` ("muon"/"adamw"), ``name``, ``lr`` and ``initial_lr`` (its base rate times
    ``init_lr_frac``); Muon groups ``polar_dtype``. ``muon_momentum``, ``ns_steps``, ``betas``, ``eps`` and
    ``matrix_optimizer`` are options of recipe 2025-12 (HEAD's are fixed, as nanochat's); ``matrix_optimizer="adamw"``
    (an ablation, not nanochat's recipe) puts the matrices in an AdamW group "adamw/matrix" at ``matrix_lr``.
    ``weight_decay``: the December AdamW groups', HEAD's Muon groups'. ``roles``: {glob of parameter names: role}
    for parameters the automatic roles do not fit ("roles" layout only). ``split_fused``: orthogonalise the blocks
    of fused projections (Phi3's qkv_proj, GPT-NeoX's and Falcon's query_key_value, GPT-2's c_attn, fused
    gate_up_proj) as matrices of their own, from the model's config (`fused_splits`; off: whole, as nanochat
    orthogonalises every matrix).

    Sharded automatically when torch.distributed is initialised with world size > 1 (then
    ``optimizer.reduces_gradients`` is True); ``sharded=False`` forces the single-process step (gradients must then
    be averaged by the caller, e.g. DDP). ``polar_dtype`` ("auto", "bfloat16", "float32"): the dtype Muon
    orthogonalises in; "auto" decides by device (`precision.resolve_polar_dtype`, which also says why).
    """
    settings = {k: v for k, v in locals().items() if k not in ("model", "process_group", "sharded")}
    check_values({**settings, "sharded": sharded})
    groups, layout = _param_groups(model, **settings)
    for g in groups:
        g["initial_lr"] = g["lr"]
    routing = _routing(model, groups, layout, recipe)
    cls = MuonAdamW if recipe == "2025-12" else NorMuonAdamW
    optimizer = cls(groups, process_group=process_group, sharded=sharded)
    optimizer.routing = routing
    return optimizer
