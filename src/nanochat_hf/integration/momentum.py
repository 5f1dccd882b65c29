"""Muon's momentum warm-up (nanochat's): the schedule and the Trainer callback that applies it."""

from __future__ import annotations

from transformers import TrainerCallback


def muon_momentum(step: int) -> float:
    """Linear warm-up 0.85 -> 0.95 over the first 300 optimizer steps."""
    frac = min(step / 300, 1.0)
    return (1 - frac) * 0.85 + frac * 0.95


class MuonMomentumCallback(TrainerCallback):
    """Sets Muon's momentum before each optimizer step from the global step (so resume restores it too)."""

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        opt = getattr(optimizer, "optimizer", optimizer)  # unwrap Accelerate's AcceleratedOptimizer
        if opt is not None and hasattr(opt, "set_muon_momentum"):
            opt.set_muon_momentum(muon_momentum(state.global_step))
