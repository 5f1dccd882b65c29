"""nanochat's Muon + AdamW optimizer, single-process or sharded across torch.distributed ranks."""

from .kernels import adamw_update, muon_lr_scale, muon_update, newton_schulz
from .optimizer import MuonAdamW, build_optimizer

__all__ = ["MuonAdamW", "adamw_update", "build_optimizer", "muon_lr_scale", "muon_update", "newton_schulz"]
