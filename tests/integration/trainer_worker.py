"""A transformers Trainer with NanoChatOptimizerMixin on a tiny random Llama, for test_trainer_distributed.py and
test_trainer_checkpoints.py (runs_worker.py's "trainer" runs, under `accelerate launch` in 2 or 4 processes, or
plainly in 1). Global batch 4 in every layout. run(out, flags) writes rank 0's final parameters and, per rank, how
many ranks held a Muon matrix's gradient before each optimizer step (ZeRO-2: its owner only), the optimizer's
grads_averaged flag and the logged losses (rank<r>.json).

    flags: --ddp_hook, --save_steps N, --resume CHECKPOINT, --clip NORM, --stock_clip

--ddp_hook: DDP keeps a communication hook, so it averages; --save_steps: checkpoints in OUT_DIR/run; --clip: the
max_grad_norm (default 1.0); --stock_clip: the stock Trainer's clipping of each rank's local gradients instead of
the mixin's (what the mixin must not do: the tests show that it gives other numbers).
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback, TrainingArguments

from nanochat_hf.integration import NanoChatOptimizerMixin


class NanoTrainer(NanoChatOptimizerMixin, Trainer):
    pass


class StockClipTrainer(NanoTrainer):
    _clip_grad_norm = Trainer._clip_grad_norm  # clips the local gradients, each rank by its own norm

    def create_optimizer(self, model=None):
        super().create_optimizer(model)
        self.optimizer.max_grad_norm = 0.0  # no clipping in the optimizer
        return self.optimizer


class DDPHook(TrainerCallback):
    """Registers DDP's own all-reduce hook before the mixin's callback runs: a DDP that cannot be silenced."""

    def __init__(self):
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.trainer.model_wrapped.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)


class GradCheck(TrainerCallback):
    """Before each optimizer step: how many ranks hold a Muon matrix's gradient (ZeRO-2: only its owner), and
    whether the ranks that hold it hold the same values (averaged by DDP)."""

    def __init__(self):
        self.holders, self.same = [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if dist.is_initialized():
            grad = model.model.layers[0].mlp.up_proj.weight.grad
            g = torch.zeros(64) if grad is None else grad.detach().flatten()[:64].clone()
            everyone = [torch.empty_like(g) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, g)
            held = torch.tensor([int(grad is not None)])
            dist.all_reduce(held)
            self.holders.append(int(held))
            self.same.append(torch.equal(everyone[0], everyone[1]))


def _option(flags: list[str], name: str, default: str | None = None) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else default


def tiny_run(out: Path, max_grad_norm: float = 1.0, save_steps: int = 0, accumulation: int = 1):
    """(model, dataset, args): the tiny Llama, 16 rows of 8 tokens, 4 steps of global batch 4 at any world size, in
    ``accumulation`` micro-batches per process; checkpoints in out/run every ``save_steps`` (0: none)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 64, (8,), generator=g).tolist() for _ in range(16)]
    data = Dataset.from_list([{"input_ids": r, "labels": r} for r in rows])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(output_dir=str(out / "run"), max_steps=4, gradient_accumulation_steps=accumulation,
                             per_device_train_batch_size=4 // world // accumulation, logging_steps=1,
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps,
                             report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
                             max_grad_norm=max_grad_norm, ddp_backend="gloo" if world > 1 else None)  # fmt: skip
    return model, data, args


def run(out: Path, flags: list[str]) -> None:
    ddp_hook = "--ddp_hook" in flags
    save_steps, resume = int(_option(flags, "--save_steps", "0")), _option(flags, "--resume")
    model, data, args = tiny_run(out, float(_option(flags, "--clip", "1.0")), save_steps)
    check, hook = GradCheck(), DDPHook()
    callbacks = [hook, check] if ddp_hook else [check]
    trainer = (StockClipTrainer if "--stock_clip" in flags else NanoTrainer)(
        model=model, args=args, train_dataset=data, callbacks=callbacks, nanochat_optimizer={"polar_dtype": "float32"}
    )
    hook.trainer = trainer
    if ddp_hook:  # a DDP that manages every parameter (as if the model were wrapped without the mixin's help)
        model._ddp_params_and_buffers_to_ignore = []
    trainer.train(resume_from_checkpoint=resume)
    opt = trainer.optimizer.optimizer
    rank = trainer.accelerator.process_index
    report = {
        "holders": check.holders,
        "same": check.same,
        "grads_averaged": getattr(opt, "grads_averaged", False),
        "world_size": opt.world_size,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if rank == 0:
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(out / "params.safetensors"))
