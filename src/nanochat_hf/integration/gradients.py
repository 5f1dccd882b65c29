"""The gradient contract between DDP, Accelerate and the sharded optimizer, stated and guarded in one place.

With several processes, `MuonAdamW` (``reduces_gradients=True``) does ALL gradient communication, ZeRO-2 style: each
gradient is reduced onto the rank that owns it while backward still runs, on the last micro-batch of an
accumulation, and a rank keeps only the pieces it owns (optim/reduction.py). Therefore:
1. DDP (which Accelerate always wraps a multi-process model in) must neither all-reduce the gradients nor keep its
   own copy of them in its buckets. `LocalGradients`, created with the Trainer (before the model is wrapped), tells
   DDP to ignore every trainable parameter but the smallest (`keep_ddp_off`: DDP refuses to wrap a model with none);
   when training begins, `silence_ddp` gives that one's bucket a communication hook that returns it unchanged, rank
   0's parameters are broadcast (what DDP did for all of them when wrapping), and the optimizer is told to reduce
   during backward whenever ``accelerator.sync_gradients`` says the micro-batch is the last one. `silence_ddp`
   refuses an optimizer that does not reduce gradients itself, which would silently train each rank on its own
   gradients.
2. After backward each rank holds only its own averaged pieces (other parameters' ``.grad`` is None), so anything
   that needs the global gradient (clipping by the norm of the averaged gradient) must happen inside the optimizer
   step: `clip_in_optimizer` hands `max_grad_norm` to the optimizer instead of clipping locally. With one process
   the optimizer clips too, so that 1 and W processes compute the norm the same way (the Trainer's clipping uses
   torch's fp32 vector_norm, about 1e-4 relative away from it on CPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .optimizer_state import inner_optimizer


def reduces_gradients(optimizer) -> bool:
    return bool(getattr(inner_optimizer(optimizer), "reduces_gradients", False))


def _local_gradients_hook(state, bucket):  # no annotations: DDP checks them against the real (not string) types
    """DDP communication hook that communicates nothing: gradients stay local for the sharded optimizer."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def keep_ddp_off(model: torch.nn.Module) -> str | None:
    """Before DDP wraps ``model``: make DDP ignore every trainable parameter but the smallest (no gradient bucket,
    no reduction, no initial broadcast for them). Returns the name of the one DDP keeps (None: nothing to do)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        return None
    kept = min(trainable, key=lambda item: item[1].numel())[0]
    model._ddp_params_and_buffers_to_ignore = [n for n, _ in trainable if n != kept]
    return kept


def silence_ddp(model: torch.nn.Module, optimizer) -> list[torch.nn.Parameter]:
    """Make a DDP-wrapped model (possibly inside torch.compile's wrapper) leave gradient reduction to the optimizer;
    returns the parameters DDP still manages (their gradient is final only after DDP's own copy-back)."""
    ddp = getattr(model, "_orig_mod", model)
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return []
    if not reduces_gradients(optimizer):
        raise RuntimeError("multi-process training needs the sharded optimizer (reduces_gradients=True)")
    ddp.register_comm_hook(state=None, hook=_local_gradients_hook)
    return [p for n, p in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore]


def clip_in_optimizer(optimizer, max_grad_norm: float) -> None:
    """Ask the sharded optimizer to clip the AVERAGED gradient to `max_grad_norm` (0: no clipping) in its step."""
    inner_optimizer(optimizer).max_grad_norm = max_grad_norm


class LocalGradients(TrainerCallback):
    """The Trainer's side of the contract (module docstring): created with the Trainer, before it wraps the model
    (`keep_ddp_off` with several processes); when training begins, `silence_ddp` on the outermost model, rank 0's
    parameters broadcast, and the optimizer's reduction during backward turned on."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer  # its model_wrapped: the callbacks are handed only the unwrapped model
        if trainer.accelerator.num_processes > 1:
            keep_ddp_off(trainer.model)

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        try:
            kept = silence_ddp(self.trainer.model_wrapped, optimizer)
        except RuntimeError as e:
            if "only be called once" not in str(e):  # torch's words for a second communication hook
                raise
            kept = self._foreign_hook(state, optimizer)
        if not reduces_gradients(optimizer):
            return
        for p in self.trainer.model.parameters():  # DDP broadcast only the parameter it kept
            dist.broadcast(p.data, 0)
        accelerator = self.trainer.accelerator
        inner_optimizer(optimizer).reduce_during_backward(
            lambda: accelerator.sync_gradients, skip=tuple(kept), model_order=tuple(self.trainer.model.parameters())
        )

    def _foreign_hook(self, state, optimizer) -> list[torch.nn.Parameter]:
        """DDP already has someone else's communication hook, so it reduces what it manages. If that is every
        parameter (the model was wrapped without `keep_ddp_off`), the gradients arrive averaged and the optimizer
        skips its own reduction (``grads_averaged``); otherwise DDP averages only the parameter it kept, which the
        optimizer then averages again (the same values) while it reduces the others as usual."""
        ddp = getattr(self.trainer.model_wrapped, "_orig_mod", self.trainer.model_wrapped)
        kept = [p for n, p in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore]
        trainable = [p for p in ddp.module.parameters() if p.requires_grad]
        if len(kept) == len(trainable):
            inner_optimizer(optimizer).grads_averaged = True
            said = "DDP averages the gradients (its communication hook is set already); the optimizer skips its own"
        else:
            said = (
                "DDP has a communication hook already: it averages the one parameter it keeps, the optimizer the rest"
            )
        if state.is_world_process_zero:
            print(f"nanochat optimizer: {said}", flush=True)
        return kept
