"""nanochat's Muon + AdamW optimizer, single-process or sharded across torch.distributed ranks."""

from .kernels import adamw_update, muon_lr_scale, muon_update, newton_schulz, ns_batch_size
from .optimizer import MuonAdamW, build_optimizer, state_bytes_per_rank

__all__ = ["MuonAdamW", "adamw_update", "build_optimizer", "muon_lr_scale", "muon_update", "newton_schulz",
           "ns_batch_size", "state_bytes_per_rank"]
