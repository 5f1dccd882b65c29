"""`NanoChatTrainer`: nanochat's training loop as a `transformers.Trainer` with a few hooks overridden, shared by
`MidTrainer` (mid-training and SFT, below) and `BaseTrainer` (pretraining, training/base.py).

Public hooks and callbacks where the Trainer has them; the private hooks overridden (here and in the mixin) have their
one-line reason above them and are pinned by tests/training/test_trainer_hooks.py. Where the stock behaviour is
wanted: `super()`.
- data (`get_train_dataloader`): every rank reads its own share of the packed token stream
  (`nanochat_hf.data.PackedStream`), un-prepared (Accelerate must not re-shard it), for nanochat's number of
  steps (one epoch ends as nanochat's does, see `PackedStream.epoch_steps`), the same on every rank; on CUDA the
  micro-batches go through pinned memory with non-blocking copies (`StreamLoader`).
- embedding dtype (`__init__`): the token embedding cast to `args.embedding_torch_dtype` (bfloat16 on CUDA in
  bf16, as nanochat), before the optimizer exists.
- optimizer / schedule (`NanoChatOptimizerMixin`, the glue every Trainer can use: `create_optimizer` builds
  `build_optimizer` (Muon + AdamW, sharded step) with this run's rates, Muon momentum warm-up in a callback; the
  gradient contract of integration/gradients.py with its `_clip_grad_norm`, `_get_grad_norm`; `create_scheduler`: a
  `LambdaLR` applying nanochat's multiplier to the schedule's progress.
- loss (`compute_loss`): the stock loss, plus the last micro-batch's loss handed to nanochat's logger.
- evaluation (`evaluate`): validation bits per byte over a fresh, wrapping validation stream.
- logging (`log`): nanochat's metrics added to each training log.
- checkpoints: the stock `_save_checkpoint` (best-checkpoint tracking, rotation that keeps the best, callback
  state export) into a fresh folder, with our pieces saved by the per-piece hooks it calls: safetensors/JSON only
  (plus the run fingerprint), one optimizer shard + data position + RNG state per rank, umask-derived modes; the
  matching `_load_*` hooks restore them (and apply a changed LR). Hub pushes of checkpoints (`CheckpointHubPush`)
  and the model files (`save_model`) carry no pickle.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_jit_checkpoint import JITCheckpointCallback
from transformers.utils import logging as hf_logging

from ..conversion.nanochat import NANOCHAT_META_FILE
from ..conversion.optimizer_files import apply_settings, read_warm_start
from ..data import BestFitStream, MicroBatchStream, PackedStream
from ..data.shards import SHARD_LAST, DealtStream
from ..errors import UserError, one_line
from ..evaluation import chatcore, results_table, run_chat_eval
from ..integration.mixin import NanoChatOptimizerMixin
from ..integration.optimizer_state import load_full_state, load_optimizer_state, save_optimizer_state
from ..integration.saving import unsharded_class, whole_copy, whole_state_dict
from ..jsonfile import read_json, write_json
from ..progress import Progress
from ..tasks import CHATCORE_TASKS, task_by_name
from ..tokenizer import token_bytes as compute_token_bytes
from .callbacks import (
    CheckpointHubPush,
    NanoChatConsole,
    NanoChatLogger,
    StepEndJITCheckpoint,
    device_peak_flops,
)
from .checkpoint.check import read_run_state, save_fingerprint
from .checkpoint.files import (
    disk_full_as_one_line,
    load_rng_state,
    save_rng_state,
    tensor_bytes,
    usual_modes,
)
from .checkpoint.layout import (
    DATA_STATE_FILE,
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    TRAINING_ARGS_FILE,
    checkpoint_name,
    replaced_name,
)
from .checkpoint.output_dir import staged_final_save
from .device import reuse_freed_memory, to_device, use_cpu_threads
from .evaluation import evaluate_bpb
from .report import write_model_card
from .schedule import nanochat_scheduler, steps_progress


class StreamLoader:
    """This rank's micro-batch stream, presented to the Trainer as a sized iterable of micro-batches on `device`.

    Iterating continues the stream from its position (resume) and runs on past the epoch if asked to. The tensors
    go through `to_device` (on CUDA: pinned memory, non-blocking copies; on CPU: the tensors themselves), so the
    Trainer's own placement finds them in place.
    """

    def __init__(self, stream: MicroBatchStream, num_micro_batches: int, device: torch.device | str = "cpu"):
        self.stream = stream
        self.num_micro_batches = num_micro_batches
        self.device = device

    def __len__(self) -> int:
        return self.num_micro_batches

    def __iter__(self):
        return ({k: to_device(v, self.device) for k, v in batch.items()} for batch in self.stream.read())


class NanoChatTrainer(NanoChatOptimizerMixin, Trainer):
    """What MidTrainer and BaseTrainer (training/base.py) share: the module docstring's hooks, over a subclass's
    data (`make_stream`, `get_train_dataloader`) and schedule (`create_scheduler`)."""

    def __init__(self, *args, token_bytes: torch.Tensor | None = None, run_fingerprint: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_fingerprint = run_fingerprint  # saved into every checkpoint, checked on resume (run.setup)
        self.chat_eval_scores: list = []  # filled by run.finish when chat_eval_tasks are set
        if token_bytes is None:
            token_bytes = compute_token_bytes(self.processing_class)
        self.token_bytes = token_bytes
        self.min_val_bpb = math.inf
        self._train_loader: StreamLoader | None = None
        self._data_shards: int | None = None  # data_shards(), read once (rotation may remove the checkpoint)
        # nanochat: loss = mean over the micro-batch / grad_accum (all tokens are targets in packed rows), so the
        # Trainer must not renormalise by a token count gathered across ranks.
        self.model_accepts_loss_kwargs = False
        a = self.args
        self.nanochat_log = NanoChatLogger(
            tokens_per_step=a.total_batch_size,
            flops_per_token=self.model.num_flops_per_token(),
            peak_flops=device_peak_flops(a.device, a.peak_flops),
            world_size=self.accelerator.num_processes,
        )
        self.add_callback(self.nanochat_log)
        self.preemption: StepEndJITCheckpoint | None = None  # SIGTERM: a checkpoint at a step's end, then stop
        if a.enable_jit_checkpoint:  # checkpoints at a step's end, after nanochat's logger and the log line
            self.preemption = StepEndJITCheckpoint(self.pop_callback(JITCheckpointCallback).jit_manager)
            self.add_callback(self.preemption)
        self.pop_callback(PrinterCallback)
        self.pop_callback(ProgressCallback)
        self.add_callback(NanoChatConsole(show_bar=not a.disable_tqdm))
        if a.push_to_hub:
            self.add_callback(CheckpointHubPush(self))
        if (embedding_dtype := a.embedding_torch_dtype) is not None:
            # the stock __init__ has placed the model; the optimizer is built later, on the cast parameter
            self.model.get_input_embeddings().to(embedding_dtype)
        self.nanochat_meta: dict | None = None  # the model source's nanochat meta (run.build_trainer sets it)
        # nanochat's optimizer files are read and checked now (a bad file set stops the run before training, in
        # one line), and put into the optimizer when it is built
        self.warm_start = None
        if a.nanochat_optimizer:
            full, _, fmt, settings = read_warm_start(a.nanochat_optimizer, self.model)
            self.warm_start = (full, fmt, settings)

    @property
    def preempted_at(self) -> int | None:
        """The step after which a SIGTERM stopped training (a checkpoint of it saved), else None."""
        return self.preemption.stopped_at if self.preemption is not None else None

    def train(self, *args, **kwargs):
        """Stock training, after setting the CPU threads and the allocator's reuse of freed memory on CPU (process-wide
        settings, so not at parse time)."""
        resume = kwargs.get("resume_from_checkpoint")
        if isinstance(resume, str) and resume != self.args.resume_from_checkpoint:
            self.args.resume_from_checkpoint = resume  # where data_shards() reads the run's data shards
            self._train_loader, self._data_shards = None, None
        if self.args.use_cpu or not torch.cuda.is_available():
            use_cpu_threads(self.args.num_threads, self.accelerator.num_processes)
            reuse_freed_memory()
        return super().train(*args, **kwargs)

    # ---- data -----------------------------------------------------------------------------------------------
    def make_stream(self, dataset, rank: int | None = None, world_size: int | None = None) -> MicroBatchStream:
        """The micro-batch stream of rank ``rank`` of ``world_size`` (default: this process of this run) over
        ``dataset`` (the train or eval dataset): each subclass its own data."""
        raise NotImplementedError

    def data_shards(self) -> int:
        """The run's data shards (data/shards.py): the number of processes it started with, as the checkpoint it
        resumes from says, else this run's."""
        if self._data_shards is None:
            checkpoint = self.args.resume_from_checkpoint
            world = self.accelerator.num_processes
            self._data_shards = read_run_state(Path(checkpoint))["data_shards"] if checkpoint else world
        return self._data_shards

    def shard_stream(self, token_ds, micro_batches: int) -> MicroBatchStream:
        """This process's stream: its own (`make_stream`) while the run has as many processes as data shards,
        else the shards' micro-batches dealt to the processes (``micro_batches``: this process's per step)."""
        shards, world = self.data_shards(), self.accelerator.num_processes
        if shards == world:
            return self.make_stream(token_ds)
        if micro_batches * world % shards:
            raise UserError(
                f"the run's data is {shards} shards, {micro_batches * world} micro-batches per step do not divide "
                "among them: resume with the same --device_batch_size and --total_batch_size"
            )
        make = lambda s: self.make_stream(token_ds, rank=s, world_size=shards)  # noqa: E731
        return DealtStream(make, shards, micro_batches * world // shards, self.accelerator.process_index, world)

    def floating_point_ops(self, inputs) -> int:
        return self.model.num_flops_per_token() * inputs["input_ids"][:, :-1].numel()

    # ---- optimizer and schedule -------------------------------------------------------------------------
    def optimizer_settings(self) -> dict:
        a = self.args
        return {
            "matrix_lr": a.matrix_lr,
            "embedding_lr": a.embedding_lr,
            "unembedding_lr": a.unembedding_lr,
            "weight_decay": a.weight_decay,
            "init_lr_frac": a.init_lr_frac,
            "recipe": a.optimizer_recipe,
            "polar_dtype": a.polar_dtype,
        }

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            super().create_optimizer(model)  # NanoChatOptimizerMixin: build_optimizer, clipping in the optimizer
            a = self.args
            if self.warm_start is not None:  # (a resume then replaces this state with the checkpoint's)
                full, fmt, settings = self.warm_start
                load_full_state(self.optimizer, self.model, full)
                carried = apply_settings(self.optimizer, self.model, settings, a.nanochat_optimizer)
                if self.is_world_process_zero():
                    print(
                        f"optimizer warm-started from {a.nanochat_optimizer} ({fmt} format: {len(full)} parameters' "
                        f"state; LRs from this run{'; ' + carried if carried else ''})"
                    )
                self.warm_start = None
        return self.optimizer

    # ---- loss, evaluation, logging ----------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        shard_last = inputs.pop(SHARD_LAST, None)  # dealt shards (data/shards.py): a shard's last of the step?
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.nanochat_log.micro_batch_loss((result[0] if return_outputs else result).detach(), shard_last)
        return result

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Validation bits per byte over eval_tokens // (device_batch_size * max_seq_len * processes)
        micro-batches of a fresh validation stream, which wraps around when the mixture is shorter; on a resumed
        run of another number of processes, the data shards' micro-batches dealt as in training (where they
        divide evenly), so it measures the same rows."""
        a, world, shards = self.args, self.accelerator.num_processes, self.data_shards()
        per_shard = max(1, a.eval_tokens // (a.device_batch_size * a.max_seq_len * shards))
        if per_shard * shards % world:  # the shards' micro-batches do not deal evenly: this run's own streams
            shards, per_shard = world, max(1, a.eval_tokens // (a.device_batch_size * a.max_seq_len * world))
        steps = per_shard * shards // world
        ds = self.eval_dataset if eval_dataset is None else eval_dataset
        stream = self.make_stream(ds) if shards == world else self.shard_stream(ds, steps)
        batches = ({k: v for k, v in b.items() if k != SHARD_LAST} for b in stream.read(steps))
        progress = Progress("validation", steps, "micro-batches", enabled=self.is_world_process_zero(), announce=False)
        with progress, self.accelerator.autocast():  # also before train() has wrapped the model's forward in it
            bpb = evaluate_bpb(self.model, progress.wrap(batches), self.token_bytes, a.device)
        self.min_val_bpb = min(self.min_val_bpb, bpb)
        metrics = {f"{metric_key_prefix}_val_bpb": bpb, f"{metric_key_prefix}_min_val_bpb": self.min_val_bpb}
        metrics.update(self.evaluation_extras(metric_key_prefix))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(a, self.state, self.control, metrics)
        return metrics

    def evaluation_extras(self, prefix: str = "eval") -> dict[str, float]:
        """More metrics for an evaluation's log (MidTrainer: ChatCORE at its steps)."""
        return {}

    def generation_model(self) -> torch.nn.Module:
        """The model the chat evaluations generate with: the unwrapped model, or, where FSDP2 shards it, a whole copy
        on every process (a collective: every process calls it). Sharded, every forward is a collective, and the
        ranks, each with its own problems, would generate different numbers of tokens. The copy (once after training,
        for the sample chat and the evaluations, and at each ChatCORE) needs the whole model in each process's
        memory."""
        model = self.accelerator.unwrap_model(self.model)
        whole = whole_copy(model, self.args.device)
        return model if whole is None else whole

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.state.global_step > 0:  # a training step's log: add nanochat's metrics
            self.nanochat_log.enrich(logs, self.state.global_step)
        super().log(logs, start_time)  # NanoChatOptimizerMixin: grad_norm is the optimizer's, where it clips

    # ---- checkpoints: the stock _save_checkpoint calls these per-piece hooks ------------------------------
    # private hook: no public one runs before a checkpoint is written (set an old one aside, undo on a full disk)
    def _save_checkpoint(self, model, trial) -> None:
        """The stock save, into a fresh folder: a checkpoint-<step> already there (an earlier run's, or a damaged
        one skipped on resume) is renamed aside and removed only once the new one is complete."""
        target = Path(self._get_output_dir(trial=trial)) / checkpoint_name(self.state.global_step)
        aside = target.with_name(replaced_name(target.name))
        if self.args.should_save and target.exists():
            os.replace(target, aside)
        self.accelerator.wait_for_everyone()

        def undo() -> None:  # a full disk: the partial folder goes, the one set aside comes back
            shutil.rmtree(target, ignore_errors=True)
            if aside.exists():
                os.replace(aside, target)

        needed = tensor_bytes(self.model.state_dict(), dict(self.optimizer.state))  # this rank's share
        with disk_full_as_one_line(f"checkpoint {target.name}", target.parent, needed, undo):
            super()._save_checkpoint(model, trial)
        if self.args.should_save and aside.exists():
            shutil.rmtree(aside)

    # private hook: the stock push pickles the arguments into output_dir; CheckpointHubPush (on_save) pushes
    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        return

    # private hook: the stock one pickles one optimizer state, and no public hook writes before trainer_state.json
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Each rank writes its own optimizer shard as safetensors (the stock hook pickles one full state)."""
        out, rank = Path(output_dir), self.accelerator.process_index
        out.mkdir(parents=True, exist_ok=True)
        save_optimizer_state(self.optimizer, self.model, out / OPTIMIZER_FILE.format(rank=rank))
        stream = self._train_loader.stream
        shards = stream.shard_states() if isinstance(stream, DealtStream) else {rank: stream.state_dict()}
        for shard, state in shards.items():
            write_json(out / DATA_STATE_FILE.format(rank=shard), state)
        if self.args.should_save:
            if self.run_fingerprint is not None:
                save_fingerprint(out, self.run_fingerprint)
            write_json(out / SCHEDULER_FILE, self.lr_scheduler.state_dict())
            write_json(
                out / STATE_FILE,
                {
                    "logger": self.nanochat_log.state_dict(),
                    "min_val_bpb": self.min_val_bpb,
                    "world_size": self.accelerator.num_processes,
                    "data_shards": self.data_shards(),
                },
            )

    # private hook: the stock one pickles the RNG states (rng_state.pth) of the checkpoint being written
    def _save_rng_state(self, output_dir: str) -> None:
        """Per rank; then wait for every rank, so trainer_state.json (written next, by rank 0) marks a complete
        checkpoint (`run.latest_checkpoint` only resumes from such)."""
        save_rng_state(output_dir, self.accelerator.process_index)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            usual_modes(output_dir)  # safetensors' save_file makes 0600 files: the umask-derived mode instead

    # private hook: reads our pieces where the stock resume reads its pickles (optimizer built, not yet stepped)
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Each rank reads its part of the optimizer state (any world size), the schedule, the data positions of its
        data shards and the logger's state."""
        if checkpoint is None:
            return
        ckpt = Path(checkpoint)
        meta = read_run_state(ckpt)
        fresh = [g["initial_lr"] for g in self.optimizer.param_groups]  # from this run's arguments
        load_optimizer_state(self.optimizer, self.model, ckpt)
        self.lr_scheduler.load_state_dict(read_json(ckpt / SCHEDULER_FILE))
        if fresh != [g["initial_lr"] for g in self.optimizer.param_groups]:
            # a changed LR (run.setup checked the fingerprint and said so): the new base rates, same multiplier
            multiplier = self.lr_scheduler.lr_lambdas[0](self.lr_scheduler.last_epoch)
            self.lr_scheduler.base_lrs = list(fresh)
            for group, lr in zip(self.optimizer.param_groups, fresh):
                group["initial_lr"], group["lr"] = lr, lr * multiplier
            self.lr_scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]  # what get_last_lr reports
        self.load_data_state(ckpt)
        self.nanochat_log.load_state_dict(meta["logger"])
        self.min_val_bpb = meta["min_val_bpb"]

    def load_data_state(self, checkpoint: Path) -> None:
        """The data positions of this process's data shards, saved in ``checkpoint``."""
        stream = self.get_train_dataloader().stream
        if isinstance(stream, DealtStream):
            stream.load_shard_states(lambda shard: read_json(checkpoint / DATA_STATE_FILE.format(rank=shard)))
        else:
            stream.load_state_dict(read_json(checkpoint / DATA_STATE_FILE.format(rank=self.accelerator.process_index)))

    # private hook: restores our RNG state where the stock resume restores its pickle (at the epoch's start)
    def _load_rng_state(self, checkpoint: str | None) -> None:
        """This rank's RNG state from safetensors + JSON (the stock hook unpickles rng_state.pth); on another number
        of processes rank r's of the W that saved it, r mod W (the training step draws no random numbers)."""
        if checkpoint is not None:
            saved = read_run_state(Path(checkpoint))["world_size"]
            load_rng_state(checkpoint, self.accelerator.process_index % saved)

    # ---- model files --------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Our writer (`write_model`), then as the stock method a push if the user calls it with push_to_hub."""
        self.write_model(output_dir)
        if self.args.push_to_hub and not _internal_call:  # checkpoints and push_to_hub itself call it internally
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def write_model(self, output_dir: str | None = None) -> None:
        """save_pretrained (safetensors, config + auto_map + code, generation config), tokenizer, args as JSON
        (never the stock training_args.bin pickle); staged INSIDE the target (its parent may not be writable) and
        moved in file by file (each move atomic), with the umask-derived file modes."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        whole = whole_state_dict(model)  # FSDP2: gathered (every process takes part), else None: the model's own
        if not self.args.should_save:
            return
        out = Path(output_dir or self.args.output_dir)
        needed = tensor_bytes(whole or model.state_dict())
        # a full disk: staged_final_save has removed its staging folder by the time the error is reworded
        with disk_full_as_one_line("the model", out, needed), staged_final_save(out) as tmp:
            bars = hf_logging.is_progress_bar_enabled()
            if self.args.disable_tqdm:  # transformers' "Writing model shards" bar follows --disable_tqdm too
                hf_logging.disable_progress_bar()
            try:
                with unsharded_class(model):
                    model.save_pretrained(tmp, state_dict=whole)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            if self.processing_class is not None:
                self.processing_class.save_pretrained(tmp)
            write_json(tmp / TRAINING_ARGS_FILE, self.args.to_dict())
            if self.nanochat_meta is not None:  # as it came in, with this model's val bpb: to-nanochat writes it back
                val = [h["eval_val_bpb"] for h in self.state.log_history if "eval_val_bpb" in h]
                write_json(tmp / NANOCHAT_META_FILE, {**self.nanochat_meta, **({"val_bpb": val[-1]} if val else {})})

    def create_model_card(self, **kwargs) -> None:
        if self.is_world_process_zero():
            write_model_card(self, self.args.output_dir)


class MidTrainer(NanoChatTrainer):
    """nanochat's mid-training and SFT: the mixtures' token streams, the schedule of their progress, ChatCORE."""

    def make_stream(self, token_ds, rank: int | None = None, world_size: int | None = None) -> MicroBatchStream:
        """The packed stream of rank ``rank`` of ``world_size`` (default: this process of this run) over a
        tokenized dataset (a subclass may feed other data): the December token stream, or nanochat HEAD's best-fit
        rows (`packing`)."""
        where = {
            "rank": self.accelerator.process_index if rank is None else rank,
            "world_size": self.accelerator.num_processes if world_size is None else world_size,
        }
        a = self.args
        if a.packing == "bestfit":
            return BestFitStream(
                token_ds, a.max_seq_len, a.device_batch_size, self.processing_class.bos_token_id, **where
            )
        return PackedStream(token_ds, max_seq_len=a.max_seq_len, device_batch_size=a.device_batch_size, **where)

    def get_train_dataloader(self) -> StreamLoader:
        if self._train_loader is None:
            ga = self.args.gradient_accumulation_steps
            stream = self.shard_stream(self.train_dataset, ga)
            self.nanochat_log.loss_shards = self.data_shards() if isinstance(stream, DealtStream) else None
            epoch_steps = stream.epoch_steps(ga)
            if epoch_steps <= 0:  # also with --num_iterations: each step would repeat the same rows
                raise UserError(
                    f"train mixture too small: one optimizer step needs {ga} micro-batches of "
                    f"{self.args.device_batch_size}x{self.args.max_seq_len} tokens per rank, the whole mixture fills "
                    f"{stream.num_micro_batches()} (its rows would be repeated within a step): add rows, or lower "
                    "--total_batch_size / --device_batch_size"
                )
            steps = self.args.num_iterations if self.args.num_iterations > 0 else epoch_steps
            self._train_loader = StreamLoader(stream, steps * ga, self.args.device)
        return self._train_loader

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """nanochat's multiplier of the schedule's progress: with num_iterations = -1 the data cursor's
        (`PackedStream.lr_progress`), else optimizer steps / num_iterations."""
        if self.lr_scheduler is None:
            if self.args.num_iterations > 0:
                progress = steps_progress(num_training_steps)
                # the console shows the fraction of steps done (nanochat: of micro-batches drawn)
                self.nanochat_log.progress = lambda step: (step + 1) / num_training_steps
            else:
                stream, ga = self.get_train_dataloader().stream, self.args.gradient_accumulation_steps
                progress = lambda step: stream.lr_progress(step, ga)  # noqa: E731
                self.nanochat_log.progress = progress  # nanochat shows the schedule's progress
            self.lr_scheduler = nanochat_scheduler(
                self.optimizer if optimizer is None else optimizer, progress, self.args.warmdown_ratio
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def evaluation_extras(self, prefix: str = "eval") -> dict[str, float]:
        step, every = self.state.global_step, self.args.chatcore_every
        if every > 0 and step > 0 and (step % every == 0 or step == self.state.max_steps):
            return self.chatcore_metrics(prefix)
        return {}

    def chatcore_metrics(self, prefix: str = "eval") -> dict[str, float]:
        """nanochat's ChatCORE of the model now (every rank takes its share of the problems): its five tasks,
        at most chatcore_max_cat problems per categorical and chatcore_max_sample per generative task. A task whose
        data cannot be loaded (a hub task offline) is skipped with one line; ChatCORE is then over the others."""
        a, model = self.args, self.generation_model()
        scores = []
        for name in CHATCORE_TASKS:
            limit = a.chatcore_max_cat if task_by_name(name).mode == "categorical" else a.chatcore_max_sample
            try:
                with torch.no_grad(), self.accelerator.autocast():
                    scores += run_chat_eval(
                        model,
                        self.processing_class,
                        [name],
                        None if limit < 0 else limit,
                        batch_size=a.device_batch_size,
                        seed=a.seed,
                    )
            except (UserError, OSError) as e:  # a task whose data cannot be loaded (DataLoadError), e.g. offline
                if self.is_world_process_zero():
                    print(f"mid_train: ChatCORE: {name} skipped: {one_line(e)}", flush=True)
        if not scores:
            return {}
        if self.is_world_process_zero():
            print(f"step {self.state.global_step:05d} | ChatCORE:\n{results_table(scores)}", flush=True)
        return {f"{prefix}_chatcore": chatcore(scores), **{f"{prefix}_chatcore/{s.task}": s.accuracy for s in scores}}
