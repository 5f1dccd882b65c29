"""nanochat's Muon + AdamW optimizer, single-process or sharded across torch.distributed ranks."""

from .head import RECIPES, NorMuonAdamW
from .kernels import (
    adamw_update,
    muon_lr_scale,
    muon_update,
    newton_schulz,
    normuon_update,
    ns_batch_size,
    polar_express,
)
from .optimizer import MuonAdamW
from .precision import POLAR_DTYPES, resolve_polar_dtype
from .routing import ROLES, Route, Routing, build_optimizer

__all__ = [
    "POLAR_DTYPES",
    "RECIPES",
    "ROLES",
    "MuonAdamW",
    "NorMuonAdamW",
    "Route",
    "Routing",
    "adamw_update",
    "build_optimizer",
    "muon_lr_scale",
    "muon_update",
    "newton_schulz",
    "normuon_update",
    "ns_batch_size",
    "polar_express",
    "resolve_polar_dtype",
]
