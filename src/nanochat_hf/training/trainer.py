"""`MidTrainer`: nanochat's mid-training loop as a `transformers.Trainer` with a few hooks overridden.

What differs from a stock Trainer, and why:
- data: every rank reads its own share of the packed token stream (`nanochat_hf.data.PackedStream`: conversations
  rank, rank+W, ...), so `get_train_dataloader` returns that stream un-prepared (Accelerate must not re-shard it),
  cut to whole optimizer steps; all ranks compute the same length without communication, so all stop together.
- optimizer / schedule: `build_optimizer` (Muon + AdamW, sharded step), transformers' WSD schedule (which is
  exactly nanochat's multiplier, see `create_scheduler`), Muon momentum warm-up in a callback.
- gradients: the sharded optimizer reduce-scatters the gradients itself, so DDP must not all-reduce them too (see
  `_prepare_for_training`).
- evaluation: validation bits per byte (`evaluate`), tracking the minimum.
- checkpoints: safetensors/JSON only, one optimizer shard + data position + RNG per rank, written atomically.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Trainer
from transformers.optimization import get_wsd_schedule
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .callbacks import (
    MuonMomentumCallback,
    NanoChatLogger,
    NanoChatPrinterCallback,
    NanoChatProgressCallback,
    device_peak_flops,
)
from .checkpoint_io import load_optimizer_state, load_rng_state, read_json, save_optimizer_state, save_rng_state, write_json
from .evaluation import evaluate_bpb


class StreamLoader:
    """This rank's `PackedStream`, presented to the Trainer as a sized iterable of micro-batches.

    Restarts the stream when it runs out (only when --num_iterations asks for more than one epoch).
    """

    def __init__(self, stream, num_micro_batches: int):
        self.stream = stream
        self.num_micro_batches = num_micro_batches

    def __len__(self) -> int:
        return self.num_micro_batches

    def __iter__(self):
        while True:
            yielded = False
            for batch in self.stream:
                yielded = True
                yield batch
            if not yielded:
                return


def _local_gradients_hook(state, bucket):  # no annotations: DDP checks them against the real (not string) types
    """DDP communication hook that communicates nothing: gradients stay local for the sharded optimizer."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


class MidTrainer(Trainer):
    def __init__(self, *args, token_bytes: torch.Tensor | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if token_bytes is None:
            from nanochat_hf.tokenizer import token_bytes as compute_token_bytes

            token_bytes = compute_token_bytes(self.processing_class)
        self.token_bytes = token_bytes
        self.min_val_bpb = math.inf
        self._train_loader: StreamLoader | None = None
        # nanochat: loss = mean over the micro-batch / grad_accum (all tokens are targets in packed rows), so the
        # Trainer must not renormalise by a token count gathered across ranks.
        self.model_accepts_loss_kwargs = False
        args_ = self.args
        self.nanochat_log = NanoChatLogger(
            tokens_per_step=args_.total_batch_size,
            flops_per_token=self.model.num_flops_per_token(),
            peak_flops=device_peak_flops(args_.device, args_.peak_flops),
            world_size=self.accelerator.num_processes,
        )
        self.add_callback(MuonMomentumCallback())
        self.add_callback(self.nanochat_log)
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(NanoChatProgressCallback())
        if self.pop_callback(PrinterCallback) is not None:
            self.add_callback(NanoChatPrinterCallback())

    # ---- data -----------------------------------------------------------------------------------------------
    def make_stream(self, token_ds):
        """This rank's packed stream over a tokenized dataset (override in tests to feed other data)."""
        from nanochat_hf.data import PackedStream

        return PackedStream(
            token_ds,
            max_seq_len=self.args.max_seq_len,
            device_batch_size=self.args.device_batch_size,
            rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes,
        )

    def get_train_dataloader(self) -> StreamLoader:
        if self._train_loader is None:
            stream = self.make_stream(self.train_dataset)
            ga = self.args.gradient_accumulation_steps
            steps_per_epoch = stream.num_micro_batches() // ga
            if steps_per_epoch == 0:
                raise ValueError(
                    f"train mixture too small: one optimizer step needs {ga} micro-batches of "
                    f"{self.args.device_batch_size}x{self.args.max_seq_len} tokens per rank, the epoch has "
                    f"{stream.num_micro_batches()}"
                )
            steps = self.args.num_iterations if self.args.num_iterations > 0 else steps_per_epoch
            self._train_loader = StreamLoader(stream, steps * ga)
        return self._train_loader

    def floating_point_ops(self, inputs) -> int:
        return self.model.num_flops_per_token() * inputs["input_ids"][:, :-1].numel()

    # ---- optimizer and schedule -------------------------------------------------------------------------
    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            from nanochat_hf.optim import build_optimizer

            a = self.args
            self.optimizer = build_optimizer(
                self.model,
                matrix_lr=a.matrix_lr,
                embedding_lr=a.embedding_lr,
                unembedding_lr=a.unembedding_lr,
                weight_decay=a.weight_decay,
                init_lr_frac=a.init_lr_frac,
            )
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """nanochat's multiplier as transformers' warmup-stable-decay schedule.

        With no warm-up, a stable phase of 0.8*N steps and a linear decay over N - 0.8*N steps (fractional step
        counts are fine: the lambda only compares and divides; N - 0.8N is exact in floating point, so the phases
        end exactly at N), step s gets 1 while s < 0.8N and 1 - (s - 0.8N)/(0.2N) = nanochat's 1 - (s/N - 0.8)/0.2
        after, and 0 at s = N (min_lr_ratio=0). The lambda's max(1, decay_steps) only matters when 0.2N < 1, where
        no integer step falls in the decay phase. LambdaLR multiplies each group's `initial_lr` (set by
        build_optimizer, already scaled by init_lr_frac). Checked step by step in tests/training/test_units.py.
        """
        if self.lr_scheduler is None:
            n = num_training_steps
            self.lr_scheduler = get_wsd_schedule(
                self.optimizer if optimizer is None else optimizer,
                num_warmup_steps=0,
                num_stable_steps=0.8 * n,
                num_decay_steps=n - 0.8 * n,
                decay_type="linear",
                min_lr_ratio=0.0,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    # ---- no DDP all-reduce --------------------------------------------------------------------------------
    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        """Let Accelerate wrap the model as usual, then silence DDP's gradient all-reduce.

        Options considered: (1) not wrapping at all -- Trainer/Accelerate always wrap a multi-process model in DDP
        inside `accelerator.prepare` (skipping that means re-implementing `_prepare_for_training`); (2) running every
        micro-step under `no_sync` -- DDP would still all-reduce whenever the Trainer leaves no_sync (last
        micro-step); (3) keeping DDP and registering a communication hook that returns the local gradient bucket
        unchanged. (3) is used: DDP still broadcasts rank 0's weights at wrap time (identical start), `no_sync`
        during accumulation keeps its meaning, and the only gradient traffic is the optimizer's reduce-scatter,
        once per optimizer step (the model has no buffers, so DDP's forward-time buffer sync sends nothing).
        """
        model, train_dataloader = super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        ddp = getattr(model, "_orig_mod", model)  # under --torch_compile, DDP sits inside the compiled wrapper
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            if not getattr(optimizer, "reduces_gradients", False):
                raise RuntimeError("multi-process training needs the sharded optimizer (reduces_gradients=True)")
            ddp.register_comm_hook(state=None, hook=_local_gradients_hook)
        return model, train_dataloader

    # ---- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Validation bits per byte over the first `eval_tokens` tokens of the validation stream."""
        stream = self.make_stream(self.eval_dataset if eval_dataset is None else eval_dataset)
        a = self.args
        steps = max(1, a.eval_tokens // (a.device_batch_size * a.max_seq_len * self.accelerator.num_processes))
        steps = min(steps, stream.num_micro_batches())
        bpb = evaluate_bpb(self.model, itertools.islice(iter(stream), steps), self.token_bytes, a.device)
        self.min_val_bpb = min(self.min_val_bpb, bpb)
        metrics = {f"{metric_key_prefix}_val_bpb": bpb, f"{metric_key_prefix}_min_val_bpb": self.min_val_bpb}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(a, self.state, self.control, metrics)
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.state.global_step > 0:  # a training step's log: add nanochat's metrics
            self.nanochat_log.enrich(logs, self.state.global_step, self.state.max_steps)
        super().log(logs, start_time)

    # ---- checkpoints --------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _save_checkpoint(self, model, trial) -> None:
        """Write checkpoint-<step> atomically: everything goes to a temp dir that rank 0 renames at the end."""
        if self.args.dry_run:
            return
        self.store_flos()
        run_dir = Path(self._get_output_dir(trial=trial))
        final = run_dir / f"checkpoint-{self.state.global_step}"
        tmp = run_dir / f".tmp-checkpoint-{self.state.global_step}"
        rank = self.accelerator.process_index
        if self.args.should_save:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        self.save_model(str(tmp), _internal_call=True)
        save_optimizer_state(self.optimizer.state_dict(), tmp / f"optimizer.rank{rank}.safetensors")
        write_json(tmp / f"data_state.rank{rank}.json", self._train_loader.stream.state_dict())
        save_rng_state(tmp, rank)
        if self.args.should_save:
            write_json(tmp / "scheduler.json", self.lr_scheduler.state_dict())
            write_json(tmp / "nanochat_state.json", {
                "logger": self.nanochat_log.state_dict(),
                "min_val_bpb": self.min_val_bpb,
                "world_size": self.accelerator.num_processes,
            })
            self.state.save_to_json(str(tmp / "trainer_state.json"))
        self._barrier()
        if self.args.should_save:
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            from transformers.trainer_utils import rotate_checkpoints

            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit, use_mtime=True)
        self._barrier()
        if self.args.push_to_hub:
            self._push_from_checkpoint(str(final))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        ckpt, rank = Path(checkpoint), self.accelerator.process_index
        meta = read_json(ckpt / "nanochat_state.json")
        if meta["world_size"] != self.accelerator.num_processes:
            raise ValueError(
                f"{ckpt}: written by {meta['world_size']} processes, resuming with {self.accelerator.num_processes}; "
                "the optimizer shards and data positions are per rank"
            )
        self.optimizer.load_state_dict(load_optimizer_state(ckpt / f"optimizer.rank{rank}.safetensors"))
        self.lr_scheduler.load_state_dict(read_json(ckpt / "scheduler.json"))
        self.get_train_dataloader().stream.load_state_dict(read_json(ckpt / f"data_state.rank{rank}.json"))
        self.nanochat_log.load_state_dict(meta["logger"])
        self.min_val_bpb = meta["min_val_bpb"]

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint is not None:
            load_rng_state(checkpoint, self.accelerator.process_index)

    def _load_scaler(self, checkpoint: str | None) -> None:  # no fp16 grad scaler in this recipe
        return

    # ---- final save -------------------------------------------------------------------------------------
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """save_pretrained (safetensors, config + auto_map + code, generation config), tokenizer, args as JSON."""
        if not self.args.should_save:
            return
        out = Path(output_dir or self.args.output_dir)
        tmp = out.parent / f".tmp-save-{out.name}"  # write aside, then move file by file (each move atomic)
        shutil.rmtree(tmp, ignore_errors=True)
        self.accelerator.unwrap_model(self.model, keep_torch_compile=False).save_pretrained(tmp)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(tmp)
        write_json(tmp / "training_args.json", self.args.to_dict())
        out.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
        tmp.rmdir()

    def create_model_card(self, **kwargs) -> None:
        if self.is_world_process_zero():
            from .report import write_model_card

            write_model_card(self, self.args.output_dir)
