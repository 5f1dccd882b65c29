"""nanochat HEAD's pretraining (scripts/base_train.py at 92d63d4) on the Trainer: the model sized from --depth, the
run's size from HEAD's scaling rules (`plan_run`), and `BaseTrainer` (MidTrainer's sibling on `NanoChatTrainer`) with
the pretraining data (`data.pretraining.PretrainStream`), HEAD's schedules (LR, Muon momentum and weight decay per
step), CORE and samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback

from ..conversion.generations import BY_NAME, layer_windows, meta_model_config
from ..data.pretraining import PretrainStream
from ..errors import UserError, one_line
from ..jsonfile import read_json
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from .base_arguments import HEAD_KNOBS, BaseTrainingArguments
from .checkpoint.layout import DATA_STATE_FILE
from .schedule import base_lr_multiplier, base_muon_momentum, base_weight_decay
from .trainer import NanoChatTrainer, StreamLoader

G5 = BY_NAME["G5"]  # today's nanochat GPT
B_REF = 2**19  # HEAD: the optimal batch of d12, in tokens
SAMPLE_PROMPTS = (  # HEAD's
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
)


def base_model_config(args: BaseTrainingArguments, tokenizer, depth: int | None = None) -> NanoChatGPTConfig:
    """HEAD's `build_model_meta(depth)`: model_dim = depth * aspect_ratio rounded up to a multiple of head_dim,
    model_dim / head_dim heads (as many kv heads), the window pattern tiled over the layers, the vocabulary padded to
    64."""
    depth = args.depth if depth is None else depth
    model_dim = -(-depth * args.aspect_ratio // args.head_dim) * args.head_dim
    layer_types, sliding_window = layer_windows(G5, args.window_pattern.upper(), args.max_seq_len, depth)
    return NanoChatGPTConfig(
        sequence_len=args.max_seq_len,
        vocab_size=len(tokenizer),
        n_layer=depth,
        n_head=model_dim // args.head_dim,
        n_kv_head=model_dim // args.head_dim,
        n_embd=model_dim,
        pad_vocab_size_to=64,
        layer_types=layer_types,
        sliding_window=sliding_window,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **G5.fields,
    )


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """HEAD's `num_scaling_params`: the parameters by kind."""
    counts = dict.fromkeys(("wte", "value_embeds", "lm_head", "transformer_matrices", "scalars"), 0)
    for name, p in model.named_parameters():
        kind = (
            "wte"
            if name.startswith("transformer.wte.")
            else "value_embeds"
            if name.startswith("transformer.value_embeds.")
            else "lm_head"
            if name.startswith("lm_head.")
            else "transformer_matrices"
            if name.startswith("transformer.h.")
            else "scalars"
        )
        counts[kind] += p.numel()
    return {**counts, "total": sum(counts.values())}


def _meta_model(config: NanoChatGPTConfig) -> NanoChatGPTForCausalLM:
    with torch.device("meta"):
        return NanoChatGPTForCausalLM(config)


@dataclass
class Plan:
    """What HEAD derives from the model's size before training (the lines it prints)."""

    param_counts: dict[str, int]
    flops_per_token: int
    num_scaling_params: int
    target_tokens: int
    total_batch_size: int
    num_iterations: int
    grad_accum_steps: int
    batch_lr_scale: float
    weight_decay: float
    lines: list[str] = field(default_factory=list)


def plan_run(args: BaseTrainingArguments, tokenizer, world_size: int) -> Plan:
    """HEAD's scaling rules: steps from num_iterations, else target_flops, else target_param_data_ratio x scaling
    params (transformer matrices + lm_head); the batch (total_batch_size -1) from a d12 reference of 2^19 tokens
    scaled by (tokens / d12's tokens)^0.383 to a power of 2; LRs x sqrt(B / 2^19); Muon's weight decay x
    sqrt(B / 2^19) x (d12's tokens / tokens). UserError for a batch that does not divide across the ranks."""
    model = _meta_model(base_model_config(args, tokenizer))
    counts = parameter_counts(model)
    scaling = counts["transformer_matrices"] + counts["lm_head"]
    flops = model.num_flops_per_token()
    target_tokens = int(args.target_param_data_ratio * scaling)
    d12 = parameter_counts(_meta_model(base_model_config(args, tokenizer, depth=12)))
    d_ref = args.target_param_data_ratio * (d12["transformer_matrices"] + d12["lm_head"])
    lines = [f"parameters: {', '.join(f'{k} {v:,}' for k, v in counts.items())}", f"FLOPs per token: {flops:e}"]
    batch = args.total_batch_size
    if batch == -1:
        batch = 2 ** round(math.log2(B_REF * (target_tokens / d_ref) ** 0.383))
        lines.append(f"total batch size {batch:,} tokens (HEAD's rule: d12's {B_REF:,} x (tokens / d12's)^0.383)")
    lr_scale = (batch / B_REF) ** 0.5 if batch != B_REF else 1.0
    weight_decay = args.weight_decay * math.sqrt(batch / B_REF) * (d_ref / target_tokens)
    if args.num_iterations > 0:
        steps, why = args.num_iterations, "num_iterations"
    elif args.target_flops > 0:
        steps, why = round(args.target_flops / (flops * batch)), f"target_flops {args.target_flops:e}"
    else:
        steps, why = target_tokens // batch, f"target_param_data_ratio {args.target_param_data_ratio}"
    if steps <= 0:
        raise UserError(f"{why} gives {steps} steps of {batch:,} tokens: raise it, or set num_iterations")
    per_micro = args.device_batch_size * args.max_seq_len * world_size
    if batch % per_micro:
        raise UserError(
            f"total_batch_size={batch} is not divisible by device_batch_size*max_seq_len*world_size = "
            f"{args.device_batch_size}*{args.max_seq_len}*{world_size} = {per_micro}"
        )
    accumulation = batch // per_micro
    lines += [
        f"steps: {steps:,} (from {why}), tokens: {batch * steps:,} (tokens : scaling params "
        f"{batch * steps / scaling:.2f}), training FLOPs: {flops * batch * steps:e}",
        f"batch: {batch:,} tokens = {args.device_batch_size} x {args.max_seq_len} x {world_size} processes x "
        f"{accumulation} accumulation steps",
        f"LRs x {lr_scale:.4f} (batch / {B_REF:,})^0.5, Muon weight decay {args.weight_decay} -> {weight_decay:.6f}",
    ]
    return Plan(counts, flops, scaling, target_tokens, batch, steps, accumulation, lr_scale, weight_decay, lines)


def apply_plan(args: BaseTrainingArguments, plan: Plan) -> None:
    """The derived values into the arguments the Trainer reads."""
    args.total_batch_size, args.gradient_accumulation_steps = plan.total_batch_size, plan.grad_accum_steps
    args.num_iterations = args.max_steps = plan.num_iterations


class BaseSchedule(TrainerCallback):
    """HEAD's per-step settings of the Muon groups (momentum, weight decay) before each optimizer step, and CORE and
    samples every core_metric_every / sample_every steps and at the last (after the step's log line)."""

    def __init__(self, trainer: BaseTrainer):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        n, it = args.max_steps, state.global_step
        for group in getattr(optimizer, "optimizer", optimizer).param_groups:
            if group["kind"] == "muon":
                group["momentum"] = base_muon_momentum(it, n, args.warmdown_ratio)
                group["weight_decay"] = base_weight_decay(it, n, self.trainer.plan.weight_decay)

    def on_step_end(self, args, state, control, **kwargs):
        step, last = state.global_step, state.global_step == args.max_steps
        if args.core_metric_every > 0 and (last or step % args.core_metric_every == 0):
            self.trainer.core_metric()
        if args.sample_every > 0 and (last or step % args.sample_every == 0) and state.is_world_process_zero:
            self.trainer.sample()


class BaseTrainer(NanoChatTrainer):
    """MidTrainer's sibling: HEAD's pretraining data and schedules. ``plan``: `plan_run`'s, applied to the arguments."""

    def __init__(self, *args, plan: Plan, user_config: dict | None = None, **kwargs):
        self.plan = plan  # read by optimizer_settings, which the Trainer's argument check calls
        # the datasets are the splits make_stream reads
        super().__init__(*args, train_dataset="train", eval_dataset="val", muon_momentum_warmup=False, **kwargs)
        self.user_config = user_config or {}
        self.nanochat_log.debias_offset = 0  # HEAD's base_train debiases with its 0-based step + 1
        self.add_callback(BaseSchedule(self))

    # ---- data: HEAD's shards, each process its own stride of row groups ------------------------------------
    def make_stream(self, split, rank: int | None = None, world_size: int | None = None) -> PretrainStream:
        a = self.args
        return PretrainStream(
            self.processing_class,
            a.device_batch_size,
            a.max_seq_len,
            split=split,
            rank=self.accelerator.process_index if rank is None else rank,
            world_size=self.accelerator.num_processes if world_size is None else world_size,
            data_dir=a.data_dir,
        )

    def data_shards(self) -> int:
        return self.accelerator.num_processes  # a resume on other processes continues HEAD's way (load_data_state)

    def get_train_dataloader(self) -> StreamLoader:
        if self._train_loader is None:
            a = self.args
            self._train_loader = StreamLoader(
                self.make_stream("train"), a.max_steps * a.gradient_accumulation_steps, a.device
            )
        return self._train_loader

    def load_data_state(self, checkpoint: Path) -> None:
        """This rank's saved position, or on another number of processes rank 0's: `PretrainStream` resumes from any
        rank's state as HEAD's loader does (every rank from rank 0's)."""
        path = checkpoint / DATA_STATE_FILE.format(rank=self.accelerator.process_index)
        if not path.is_file():
            path = checkpoint / DATA_STATE_FILE.format(rank=0)
        self.get_train_dataloader().stream.load_state_dict(read_json(path))

    # ---- optimizer and schedule -------------------------------------------------------------------------
    def optimizer_settings(self) -> dict:
        a, s = self.args, self.plan.batch_lr_scale
        return {
            "matrix_lr": a.matrix_lr * s,
            "embedding_lr": a.embedding_lr * s,
            "unembedding_lr": a.unembedding_lr * s,
            "scalar_lr": a.scalar_lr * s,
            "weight_decay": self.plan.weight_decay,
            "recipe": a.optimizer_recipe,
            "polar_dtype": a.polar_dtype,
        }

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            a, n = self.args, num_training_steps
            self.lr_scheduler = LambdaLR(
                self.optimizer if optimizer is None else optimizer,
                lambda it: base_lr_multiplier(it, n, a.warmup_steps, a.warmdown_ratio, a.final_lr_frac),
            )
            self.nanochat_log.progress = lambda step: step / n  # HEAD prints step / num_iterations
            self._created_lr_scheduler = True
        return self.lr_scheduler

    # ---- CORE and samples -----------------------------------------------------------------------------------
    def core_metric(self) -> None:
        """HEAD's CORE (`evaluation.core.evaluate_core`) of the model now; every rank takes part."""
        try:
            from ..evaluation.core import evaluate_core
        except ImportError as e:
            if self.is_world_process_zero():
                print(f"base_train: CORE skipped: {one_line(e)}", flush=True)
            return
        model = self.accelerator.unwrap_model(self.model)
        with torch.no_grad(), self.accelerator.autocast():
            results = evaluate_core(model, self.processing_class, max_per_task=self.args.core_metric_max_per_task)
        if self.is_world_process_zero():
            print(f"step {self.state.global_step:05d} | CORE metric: {results['core_metric']:.4f}", flush=True)
        self.log({"core_metric": results["core_metric"]})

    def sample(self) -> None:
        """HEAD's samples: greedy, 16 tokens after each prompt (BOS first)."""
        model, tok = self.accelerator.unwrap_model(self.model), self.processing_class
        model.eval()
        with torch.no_grad(), self.accelerator.autocast():
            for prompt in SAMPLE_PROMPTS:
                ids = torch.tensor(
                    [[tok.bos_token_id, *tok.encode(prompt, add_special_tokens=False)]], device=model.device
                )
                out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.bos_token_id)
                print(tok.decode(out[0, 1:]), flush=True)
        model.train()

    # ---- the final model: with base_train's meta, for to-nanochat ------------------------------------------
    def write_model(self, output_dir: str | None = None) -> None:
        a, log = self.args, self.nanochat_log
        stream = self.get_train_dataloader().stream
        self.nanochat_meta = {
            "step": self.state.global_step,
            "model_config": meta_model_config(self.model.config, a.window_pattern.upper()),
            "user_config": self.user_config,
            "device_batch_size": a.device_batch_size,
            "max_seq_len": a.max_seq_len,
            "total_batch_size": a.total_batch_size,
            "dataloader_state_dict": {k: stream.state_dict()[k] for k in ("pq_idx", "rg_idx", "epoch")},
            "loop_state": {
                "min_val_bpb": self.min_val_bpb,
                "smooth_train_loss": log.ema,
                "total_training_time": log.total_time,
            },
        }
        super().write_model(output_dir)


def user_config(args: BaseTrainingArguments) -> dict:
    """HEAD's `user_config` (its arguments as given) under its names with underscores."""
    return {name: getattr(args, name) for name in HEAD_KNOBS}
