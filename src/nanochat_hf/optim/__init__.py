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

__all__ = [
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
]
