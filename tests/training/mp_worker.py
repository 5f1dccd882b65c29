"""Instrumented mid_train run for the multi-process tests (launched as a script, not collected by pytest).

Writes, per rank, into --output_dir: params.rank{r}.safetensors (final parameters) and grads.rank{r}.safetensors
(one Muon and one AdamW parameter's gradient just before each optimizer step, i.e. after the backward passes, where
this rank still holds it; keys "<step>/<name>"). With INTERLEAVE=1 and one process, the train stream
alternates the micro-batches of ranks 0 and 1 of a 2-process run, so grad accumulation 2 on one process sees the
same global batch as 2 processes with accumulation 1.
"""

import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback

from nanochat_hf.data import MicroBatchStream, PackedStream
from nanochat_hf.training.run import build_trainer, finish, setup, train
from nanochat_hf.training.trainer import MidTrainer

PROBES = ("transformer.h.1.mlp.c_fc.weight", "lm_head.weight")


class Interleaved(MicroBatchStream):
    """Micro-batches of ranks 0 and 1 of a 2-process run, alternating (one process): grad accumulation 2G here
    is accumulation G on each of the 2 processes, and so are the epoch end and the schedule."""

    def __init__(self, token_ds, **kw):
        self.parts = [PackedStream(token_ds, rank=r, world_size=2, **kw) for r in (0, 1)]

    def num_micro_batches(self):
        return 2 * self.parts[0].num_micro_batches()

    def epoch_steps(self, grad_accum):
        return self.parts[0].epoch_steps(grad_accum // 2)

    def lr_progress(self, step, grad_accum):
        return self.parts[0].lr_progress(step, grad_accum // 2)

    def state_dict(self):
        return {"parts": [p.state_dict() for p in self.parts]}

    def load_state_dict(self, state):
        for p, s in zip(self.parts, state["parts"]):
            p.load_state_dict(s)

    def read(self, count=None):
        for i, (a, b) in enumerate(zip(*(p.read() for p in self.parts))):
            if count is not None and 2 * i >= count:
                return
            yield a
            if count is not None and 2 * i + 1 >= count:
                return
            yield b


class WorkerTrainer(MidTrainer):
    def make_stream(self, token_ds, **where):
        if os.environ.get("INTERLEAVE") == "1" and token_ds is self.train_dataset:
            return Interleaved(
                token_ds, max_seq_len=self.args.max_seq_len, device_batch_size=self.args.device_batch_size
            )
        return super().make_stream(token_ds, **where)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient whole (FSDP2's DTensor gathered: every rank calls it) on the CPU."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().contiguous()


class Probe(TrainerCallback):
    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        named = dict(model.named_parameters())
        self.grads.append({n: _whole(named[n].grad).clone() for n in PROBES if named[n].grad is not None})

    def on_train_end(self, args, state, control, model=None, **kwargs):
        rank = args.process_index
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {n: _whole(p) for n, p in model.named_parameters()},
            str(out / f"params.rank{rank}.safetensors"),
        )
        save_file(
            {f"{i}/{n}": g for i, step in enumerate(self.grads) for n, g in step.items()},
            str(out / f"grads.rank{rank}.safetensors"),
        )


if __name__ == "__main__":
    torch.use_deterministic_algorithms(False)
    trainer = build_trainer(*setup(), trainer_cls=WorkerTrainer, callbacks=[Probe()])
    finish(trainer, train(trainer))
