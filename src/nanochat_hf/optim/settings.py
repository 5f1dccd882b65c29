"""What each setting of `routing.build_optimizer` must be: `check_values` refuses a wrong type or value in one
`UserError` line naming the setting, what it got and what is expected (``init_lr_frac="0.1"`` would otherwise fail
deep inside the first step as "can't multiply sequence by non-int of type 'float'"). The defaults stay in
build_optimizer's signature; `routing.check_optimizer_settings` adds the unknown keys and the routing, and
``polar_dtype`` is checked by its owner, `precision.resolve_polar_dtype`."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import UserError
from .head import RECIPES


def _real(value: Any) -> bool:
    """A finite int or float (numpy's included), not a bool, not a string."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_AT_LEAST_0 = (lambda v: _real(v) and v >= 0, "a number >= 0")
_ABOVE_0 = (lambda v: _real(v) and v > 0, "a number > 0")
_FRACTION = (lambda v: _real(v) and 0 <= v < 1, "a number in [0, 1)")
# setting -> (accepts, what is expected)
CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "matrix_lr": _AT_LEAST_0,
    "embedding_lr": _AT_LEAST_0,
    "unembedding_lr": _AT_LEAST_0,
    "scalar_lr": _AT_LEAST_0,
    "weight_decay": _AT_LEAST_0,
    "init_lr_frac": _ABOVE_0,
    "muon_momentum": _FRACTION,
    "ns_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v, "a whole number >= 1"),
    "betas": (
        lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(_FRACTION[0](b) for b in v),
        "two numbers in [0, 1), e.g. (0.8, 0.95)",
    ),
    "eps": _ABOVE_0,
    "sharded": (lambda v: v is None or isinstance(v, bool), "True, False or None (automatic)"),
    "split_fused": (lambda v: isinstance(v, bool), "True or False"),
    "matrix_optimizer": (lambda v: v in ("muon", "adamw"), "'muon' or 'adamw'"),
    "recipe": (lambda v: v in RECIPES, "one of " + ", ".join(repr(r) for r in RECIPES)),
    "roles": (
        lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) for k in v)),
        "a dict {glob of parameter names: role}",
    ),
}


def check_values(settings: dict[str, Any]) -> None:
    """Refuse the first setting of ``settings`` (build_optimizer's keyword arguments) whose value does not fit."""
    for name, value in settings.items():
        accepts, expected = CHECKS.get(name, (lambda v: True, ""))
        if not accepts(value):
            raise UserError(f"optimizer setting {name}={value!r} ({type(value).__name__}): expected {expected}")
    if settings.get("matrix_optimizer") == "adamw" and settings.get("recipe") != "2025-12":
        raise UserError(
            f"optimizer setting matrix_optimizer='adamw' with recipe={settings.get('recipe')!r}: the AdamW ablation "
            "exists in recipe '2025-12' only"
        )
