"""nanochat's schedules: the LR multiplier (as a checkpointable `LambdaLR`); Muon's momentum warm-up is in
integration/momentum.py."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_multiplier(progress: float, warmdown_ratio: float = 0.2, final_lr_frac: float = 0.0) -> float:
    """1 until progress 1 - warmdown_ratio, then linear to final_lr_frac at progress 1.0 (and on past it).

    nanochat's mid-training (December): warmdown 0.2 to 0; its SFT at HEAD (`get_lr_multiplier` of chat_sft.py,
    no warm-up): warmdown 0.5 to 0. The formula is HEAD's; at warmdown 0.2 it gives the December numbers bit for
    bit. Progress past 1.0 (nanochat's last SFT step can read a little past the epoch) gives a small negative
    multiplier, as nanochat's does.
    """
    if progress <= 1.0 - warmdown_ratio:
        return 1.0
    decay = (progress - (1.0 - warmdown_ratio)) / warmdown_ratio
    return (1 - decay) * 1.0 + decay * final_lr_frac


def steps_progress(num_steps: int) -> Callable[[int], float]:
    """Progress of optimizer step s (from 0) when the run has a fixed number of steps: s / num_steps.

    (nanochat divides a micro-batch counter by num_iterations there; ours counts optimizer steps.)
    """
    return lambda step: step / num_steps


def nanochat_scheduler(
    optimizer: torch.optim.Optimizer, progress: Callable[[int], float], warmdown_ratio: float = 0.2
) -> LambdaLR:
    """`LambdaLR` setting every group's lr to initial_lr * lr_multiplier(progress(s)) for optimizer step s.

    `progress` must be a pure function of the step (the stream's `lr_progress` or `steps_progress`), so the
    scheduler's checkpointed state (its step count) is all a resumed run needs. LambdaLR reads each group's
    `initial_lr` (set by build_optimizer, already scaled by init_lr_frac).
    """

    def multiplier(step: int) -> float:
        return lr_multiplier(progress(step), warmdown_ratio)

    return LambdaLR(optimizer, multiplier)


# ---- nanochat HEAD's pretraining (scripts/base_train.py at 92d63d4): functions of the 0-based optimizer step ----


def base_lr_multiplier(
    it: int, num_iterations: int, warmup_steps: int, warmdown_ratio: float, final_lr_frac: float
) -> float:
    """HEAD's `get_lr_multiplier`: linear warm-up over warmup_steps, 1, then linear to final_lr_frac over the last
    round(warmdown_ratio * num_iterations) steps."""
    warmdown_iters = round(warmdown_ratio * num_iterations)
    if it < warmup_steps:
        return (it + 1) / warmup_steps
    if it <= num_iterations - warmdown_iters:
        return 1.0
    progress = (num_iterations - it) / warmdown_iters
    return progress * 1.0 + (1 - progress) * final_lr_frac


def base_muon_momentum(it: int, num_iterations: int, warmdown_ratio: float) -> float:
    """HEAD's `get_muon_momentum`: 0.85 -> 0.97 over the first 400 steps, then 0.97 -> 0.90 over the warm-down."""
    warmdown_iters = round(warmdown_ratio * num_iterations)
    warmdown_start = num_iterations - warmdown_iters
    if it < 400:
        frac = it / 400
        return (1 - frac) * 0.85 + frac * 0.97
    if it >= warmdown_start:
        progress = (it - warmdown_start) / warmdown_iters
        return 0.97 * (1 - progress) + 0.90 * progress
    return 0.97


def base_weight_decay(it: int, num_iterations: int, weight_decay: float) -> float:
    """HEAD's `get_weight_decay`: Muon's weight decay, cosine from weight_decay to 0 over the run."""
    return weight_decay * 0.5 * (1 + math.cos(math.pi * it / num_iterations))
