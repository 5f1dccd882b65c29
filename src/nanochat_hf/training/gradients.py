"""The gradient contract between DDP, Accelerate and the sharded optimizer, stated and guarded in one place.

With several processes, `MuonAdamW` (``reduces_gradients=True``) does ALL gradient communication: it
reduce-scatters (averages) the gradients inside its step. Therefore:
1. DDP (which Accelerate always wraps a multi-process model in) must not all-reduce them too: `silence_ddp`
   (called by the `LocalGradients` callback when training begins, on the Trainer's wrapped model) registers a
   communication hook that returns the local bucket unchanged (DDP still broadcasts rank 0's weights
   when wrapping, and `no_sync` during accumulation keeps its meaning). `silence_ddp` refuses an optimizer that
   does not reduce gradients itself, which would silently train each rank on its own gradients.
2. Before the optimizer step each rank holds only its LOCAL gradient, so anything that needs the global gradient
   (clipping by the norm of the averaged gradient) must happen inside the optimizer step, after the
   reduction: `clip_in_optimizer` hands `max_grad_norm` to the optimizer instead of clipping locally.
   With one process the optimizer clips too, so that 1 and W processes compute the norm the same way
   (the Trainer's clipping uses torch's fp32 vector_norm, about 1e-4 relative away from it on CPU).
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


def reduces_gradients(optimizer) -> bool:
    return bool(getattr(getattr(optimizer, "optimizer", optimizer), "reduces_gradients", False))


def _local_gradients_hook(state, bucket):  # no annotations: DDP checks them against the real (not string) types
    """DDP communication hook that communicates nothing: gradients stay local for the sharded optimizer."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def silence_ddp(model: torch.nn.Module, optimizer) -> None:
    """Make a DDP-wrapped model (possibly inside torch.compile's wrapper) leave gradient reduction to the optimizer."""
    ddp = getattr(model, "_orig_mod", model)
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return
    if not reduces_gradients(optimizer):
        raise RuntimeError("multi-process training needs the sharded optimizer (reduces_gradients=True)")
    ddp.register_comm_hook(state=None, hook=_local_gradients_hook)


def clip_in_optimizer(optimizer, max_grad_norm: float) -> None:
    """Ask the sharded optimizer to clip the AVERAGED gradient to `max_grad_norm` (0: no clipping) in its step."""
    getattr(optimizer, "optimizer", optimizer).max_grad_norm = max_grad_norm


class LocalGradients(TrainerCallback):
    """When training begins (the Trainer has wrapped the model, in DDP with several processes, and built the
    optimizer): `silence_ddp` on the outermost model."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer  # its model_wrapped: the callbacks are handed only the unwrapped model

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        silence_ddp(self.trainer.model_wrapped, optimizer)
