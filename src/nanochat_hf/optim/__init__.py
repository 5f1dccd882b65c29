"""nanochat's Muon + AdamW optimizer, single-process or sharded across torch.distributed ranks."""

from .head import RECIPES, NorMuonAdamW, build_head_optimizer
from .kernels import (
    adamw_update,
    muon_lr_scale,
    muon_update,
    newton_schulz,
    normuon_update,
    ns_batch_size,
    polar_express,
)
from .optimizer import MuonAdamW, build_optimizer
from .precision import POLAR_DTYPES, resolve_polar_dtype

__all__ = [
    "POLAR_DTYPES",
    "RECIPES",
    "MuonAdamW",
    "NorMuonAdamW",
    "adamw_update",
    "build_head_optimizer",
    "build_optimizer",
    "muon_lr_scale",
    "muon_update",
    "newton_schulz",
    "normuon_update",
    "ns_batch_size",
    "polar_express",
    "resolve_polar_dtype",
]
