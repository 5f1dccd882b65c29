"""Trainer callbacks: nanochat's per-step metrics, console lines, step-end JIT checkpoints,
hub pushes of checkpoints."""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import Future, wait
from pathlib import Path

import torch
import torch.distributed as dist
from huggingface_hub import HfApi
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_jit_checkpoint import JITCheckpointCallback
from transformers.trainer_utils import HubStrategy

from .checkpoint.layout import (
    CONFIG_FILE,
    MODEL_INDEX,
    OPTIMIZER_FILE,
    RNG_TENSORS_FILE,
    TRAINING_ARGS_FILE,
    checkpoint_name,
)

# bf16 dense peak per device, for MFU (nanochat uses the H100 number)
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "4090": 165e12}
EMA_BETA = 0.9


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite: the run stops (the run script exits non-zero)."""


def device_peak_flops(device: torch.device, override: float | None = None) -> float | None:
    if override:
        return override
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return None  # CPU/MPS: MFU is "n/a" unless --peak_flops is given


class StepEndJITCheckpoint(JITCheckpointCallback):
    """transformers' just-in-time checkpoint (`--enable_jit_checkpoint`: SIGTERM -> save -> stop), taken only at the
    end of an optimizer step and through the normal save path: after `NanoChatLogger` has counted the step and the
    step's log line is written, as every other checkpoint. (The stock callback saves from whichever hook sees the
    request first: mid-step, or at the step's end before nanochat's logger and the log line, so a resumed run
    logged other losses.) Takes over the stock callback's signal handler (`jit_manager`). With several processes
    the ranks agree at every step's end (one all-reduce of a flag): a signal to any rank stops them all after the
    same step. `stopped_at`: the step it stopped after (None: not stopped by a signal)."""

    def __init__(self, jit_manager) -> None:
        super().__init__()
        self.jit_manager = jit_manager
        self.stopped_at: int | None = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return  # never mid-step

    def on_step_begin(self, args, state, control, **kwargs):
        return

    def on_step_end(self, args, state, control, **kwargs):
        if self.jit_manager is None:
            return
        requested = torch.tensor(float(self.jit_manager.is_checkpoint_requested), device=args.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(requested, op=dist.ReduceOp.MAX)
        if requested.item():
            self.jit_manager.is_checkpoint_requested = False
            self.stopped_at = state.global_step
            control.should_save = True  # Trainer logs, then saves checkpoint-<step>, then stops
            control.should_training_stop = True

    on_epoch_end = on_step_end


class NanoChatLogger(TrainerCallback):
    """nanochat's per-step metrics, updated every optimizer step (whatever logging_steps is).

    - loss: EMA (beta 0.9) of the LAST micro-batch's loss of each step (`MidTrainer.compute_loss` hands it over:
      `micro_batch_loss`), averaged over the processes (with dealt data shards: over the shards), debiased by
      1 / (1 - 0.9^(n + 1)) after n steps, as nanochat's mid-training does. A non-finite value raises
      `NonFiniteLossError` on every rank.
    - lrm: the multiplier the optimizer's LR was set to for this step (read from the optimizer right after it
      stepped, i.e. what the scheduler applied), progress: of the run after this step.
    - dt, tok/s, MFU, total time (the first 10 steps are not counted; while they run, the time they took so far
      is shown as `warm-up`), and an ETA of the training steps left (nanochat's later releases print one): the mean
      step time of this process's steps after its first (compilation, warm-up) times the steps left.
    `enrich(logs)` adds them to a training log before it reaches any reporter. The EMA and the total time are
    saved in checkpoints (`state_dict`) so a resumed run logs the same numbers.
    """

    def __init__(
        self, tokens_per_step: int, flops_per_token: int, peak_flops: float | None, world_size: int, progress=None
    ):
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak = peak_flops * world_size if peak_flops else None
        self.progress = progress  # step (from 0) -> progress shown; set by MidTrainer.create_scheduler
        self.ema = 0.0
        self.total_time = 0.0
        self.dt = 0.0
        self.lrm = float("nan")
        self.last_loss: torch.Tensor | None = None
        # data dealt from shards (data/shards.py): the number of shards; last_loss sums their last micro-batches
        self.loss_shards: int | None = None
        self._t0 = 0.0
        self._step_times: list[float] = []  # this process's steps (for the warm-up time and the ETA)
        self.max_steps = 0
        # the debiasing's exponent is the 1-based step + this: 1 as nanochat's mid_train.py counts its steps, 0 as
        # base_train.py does (it debiases before its step counter moves on)
        self.debias_offset = 1

    def state_dict(self) -> dict:
        return {"ema": self.ema, "total_time": self.total_time}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.total_time = state["ema"], state["total_time"]

    @staticmethod
    def _sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t0 = time.perf_counter()
        if self.loss_shards:
            self.last_loss = None

    def micro_batch_loss(self, loss: torch.Tensor, shard_last: torch.Tensor | None) -> None:
        """A micro-batch's loss (detached): the last one of this process's step is nanochat's, or with dealt
        shards the sum of those that are a shard's last."""
        if shard_last is None:
            self.last_loss = loss
        elif shard_last:
            self.last_loss = loss if self.last_loss is None else self.last_loss + loss

    def on_optimizer_step(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        group = getattr(optimizer, "optimizer", optimizer).param_groups[0]
        if group["initial_lr"]:
            self.lrm = group["lr"] / group["initial_lr"]
        else:  # init_lr_frac 0: the ratio is undefined, ask the scheduler what it applied to this step
            self.lrm = lr_scheduler.lr_lambdas[0](lr_scheduler.last_epoch)

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.dt = time.perf_counter() - self._t0
        self._step_times.append(self.dt)
        self.max_steps = state.max_steps
        if state.global_step > 10:  # nanochat leaves the first 10 steps (warm-up, compilation) out
            self.total_time += self.dt
        loss = torch.zeros(()) if self.last_loss is None else self.last_loss.detach().float().clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(loss)
            loss /= self.loss_shards or dist.get_world_size()
        elif self.loss_shards:
            loss /= self.loss_shards
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"the training loss is {value} at step {state.global_step} (the model "
                "diverged); no final model was written"
            )
        self.ema = EMA_BETA * self.ema + (1 - EMA_BETA) * value

    def enrich(self, logs: dict, step: int) -> None:
        """Add nanochat's metrics to the training log written after optimizer step `step` (1-based): `loss`
        becomes nanochat's debiased EMA, the Trainer's mean over micro-batches moves to `train_loss_mean`."""
        logs["train_loss_mean"] = logs.pop("loss")
        logs["loss"] = self.ema / (1 - EMA_BETA ** (step + self.debias_offset))
        logs["lrm"] = self.lrm
        logs["progress"] = 100.0 * self.progress(step - 1)
        logs["dt_ms"] = self.dt * 1000
        tok_per_sec = self.tokens_per_step / self.dt if self.dt > 0 else 0.0
        logs["tok_per_sec"] = tok_per_sec
        if self.peak:
            logs["mfu"] = 100.0 * self.flops_per_token * tok_per_sec / self.peak
        logs["total_time_min"] = self.total_time / 60
        if step <= 10:
            logs["warmup_time_min"] = sum(self._step_times) / 60
        later = self._step_times[1:]
        if later and self.max_steps:
            logs["eta_min"] = sum(later) / len(later) * (self.max_steps - step) / 60


def format_log(logs: dict, state) -> str | None:
    """nanochat's console line for a training-step log or an evaluation log (None for other logs)."""
    if "lrm" in logs:
        mfu = f"{logs['mfu']:.2f}" if "mfu" in logs else "n/a"
        return (
            f"step {state.global_step:05d}/{state.max_steps:05d} ({logs['progress']:.2f}%) | "
            f"loss: {logs['loss']:.6f} | lrm: {logs['lrm']:.2f} | dt: {logs['dt_ms']:.2f}ms | "
            f"tok/sec: {logs['tok_per_sec']:,.0f} | mfu: {mfu} | "
            + (
                f"warm-up: {logs['warmup_time_min']:.2f}m"
                if "warmup_time_min" in logs
                else f"total time: {logs['total_time_min']:.2f}m"
            )
            + (f" | eta: {logs['eta_min']:.1f}m" if "eta_min" in logs else "")
        )
    if "eval_val_bpb" in logs:
        return (
            f"step {state.global_step:05d} | validation bpb: {logs['eval_val_bpb']:.4f} "
            f"(min {logs['eval_min_val_bpb']:.4f})"
        )
    return None


class NanoChatConsole(ProgressCallback):
    """The console: nanochat's lines on stdout (rank 0), and the Trainer's progress bar on stderr only when both
    streams are a terminal, where tqdm clears the bar, prints the line above it and redraws it. Redirected to
    files (or with --disable_tqdm true) no bar is drawn: stdout and stderr would interleave the bar's
    carriage-return updates and the lines unpredictably (stdout is block-buffered when redirected).
    """

    def __init__(self, show_bar: bool):
        super().__init__()
        self.show_bar = show_bar and sys.stdout.isatty() and sys.stderr.isatty()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.show_bar:
            super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.show_bar:
            super().on_step_end(args, state, control, **kwargs)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        return

    def on_evaluate(self, args, state, control, **kwargs):
        return

    def on_predict(self, args, state, control, **kwargs):
        return

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = format_log(logs or {}, state)
        if not (state.is_world_process_zero and line):
            return
        if self.training_bar is not None:
            self.training_bar.write(line)  # tqdm.write: clear the bar, print the line, redraw the bar
        else:
            print(line, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.show_bar:
            super().on_train_end(args, state, control, **kwargs)


class CheckpointHubPush(TrainerCallback):
    """`--push_to_hub`: each saved checkpoint is uploaded from its own folder, in the background, by rank 0: the model
    files (safetensors, JSON, code, tokenizer) to the repo's root, and with hub_strategy checkpoint / all_checkpoints
    the whole folder (only safetensors and JSON) to last-checkpoint/ or checkpoint-<step>/. As the stock push: a push
    still running skips the next one (unless hub_always_push), the end of training waits for the last, and
    `on_push_begin` fires first. (The stock push copies the weights into output_dir and pickles the arguments there as
    training_args.bin before uploading output_dir: `MidTrainer` turns it off.)"""

    MODEL_FILES = [
        "*.safetensors",
        MODEL_INDEX,
        CONFIG_FILE,
        "generation_config.json",
        "*.py",
        "tokenizer*",
        "special_tokens_map.json",
        "chat_template.*",
        TRAINING_ARGS_FILE,
    ]
    NOT_MODEL_FILES = [OPTIMIZER_FILE.format(rank="*"), RNG_TENSORS_FILE.format(rank="*")]  # safetensors too

    def __init__(self, trainer) -> None:
        self.trainer = trainer  # for its hub_model_id (rank 0, set by the stock __init__) and callback handler
        self.api = HfApi()  # one instance: its one background worker makes the uploads one after the other
        self.jobs: list[Future] = []

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or args.hub_strategy == HubStrategy.END:
            return
        if not args.hub_always_push and not all(job.done() for job in self.jobs):
            return
        self.trainer.callback_handler.on_push_begin(args, state, control)
        folder = Path(args.output_dir) / checkpoint_name(state.global_step)
        message = f"Training in progress, step {state.global_step}"
        common = dict(repo_id=self.trainer.hub_model_id, folder_path=folder, token=args.hub_token)
        common.update(run_as_future=True, revision=args.hub_revision)
        self.jobs = [job for job in self.jobs if not job.done()]
        self.jobs.append(
            self.api.upload_folder(
                **common,
                commit_message=message,
                allow_patterns=self.MODEL_FILES,
                ignore_patterns=self.NOT_MODEL_FILES,
            )
        )
        if args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            where = "last-checkpoint" if args.hub_strategy == HubStrategy.CHECKPOINT else folder.name
            self.jobs.append(
                self.api.upload_folder(**common, path_in_repo=where, commit_message=message + ", checkpoint")
            )

    def on_train_end(self, args, state, control, **kwargs):
        wait(self.jobs)
