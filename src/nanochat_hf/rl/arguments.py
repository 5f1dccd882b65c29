"""`RLArguments`: every knob of `scripts/chat_rl.py`, under chat_rl.py's names (dashes as underscores) with its
defaults, and the stock `GRPOConfig` they make (`grpo_config`: the one place the TRL settings are derived)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import OneLineArgumentParser, UserError, add_version

PROG = "chat_rl"


@dataclass
class RLArguments:
    # --- the model (as mid_train's model_source; a nanochat base dir reads chatsft_checkpoints by default) ----------
    model_source: str = field(
        metadata={
            "help": "a Hugging Face model dir or hub id, or a nanochat base / checkpoint dir (converted on the fly)"
        }
    )
    model_tag: str | None = field(default=None, metadata={"help": "nanochat model tag (default: the largest)"})
    model_step: int | None = field(default=None, metadata={"help": "nanochat checkpoint step (default: the last)"})
    checkpoint_source: str = field(default="sft", metadata={"help": "nanochat folder: base, sft, rl or mid"})
    tokenizer_dir: str | None = field(default=None, metadata={"help": "nanochat tokenizer dir (default: beside)"})
    trust_pickle: bool = field(default=False, metadata={"help": "allow unpickling nanochat's tokenizer.pkl"})
    # --- chat_rl.py's knobs ---------------------------------------------------------------------------------------
    num_epochs: int = field(default=1, metadata={"help": "epochs over the GSM8K train split"})
    device_batch_size: int = field(default=8, metadata={"help": "samples per forward pass (one pass of one prompt)"})
    examples_per_step: int = field(default=16, metadata={"help": "prompts per optimizer step, across all ranks"})
    num_samples: int = field(default=16, metadata={"help": "samples per prompt (a multiple of device_batch_size)"})
    max_new_tokens: int = field(default=256, metadata={"help": "max tokens per sample (forced calculator ones count)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_k: int = field(default=50, metadata={"help": "top-k sampling (0: off)"})
    embedding_lr: float = field(default=0.2, metadata={"help": "AdamW rate of the embeddings"})
    unembedding_lr: float = field(default=0.004, metadata={"help": "AdamW rate of the lm head"})
    matrix_lr: float = field(default=0.02, metadata={"help": "Muon rate of the matrices"})
    weight_decay: float = field(default=0.0, metadata={"help": "Muon weight decay (HEAD's optimizer)"})
    init_lr_frac: float = field(default=0.05, metadata={"help": "every rate times this at step 0, then linear to 0"})
    eval_every: int = field(default=60, metadata={"help": "pass@k every N steps, step 0 included (-1: never)"})
    eval_examples: int = field(default=400, metadata={"help": "GSM8K test problems of the pass@k evaluation"})
    save_every: int = field(
        default=60, metadata={"help": "checkpoint every N steps (the last step's model: output_dir)"}
    )
    # --- ours -------------------------------------------------------------------------------------------------------
    output_dir: str = field(default="outputs/nanochat-hf-rl", metadata={"help": "checkpoints, final model, report"})
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "a checkpoint-<step> folder, or 'last' (or 'true'): the newest complete one in output_dir"},
    )
    gsm8k_source: str = field(
        default="hub",
        metadata={
            "help": "hub: openai/gsm8k (main); demo: offline arithmetic word problems in GSM8K's layout; files: "
            "train_data_files / eval_data_files"
        },
    )
    train_data_files: list[str] | None = field(
        default=None, metadata={"help": "GSM8K-layout train rows (json/parquet)"}
    )
    eval_data_files: list[str] | None = field(default=None, metadata={"help": "GSM8K-layout test rows"})
    demo_rows: int = field(default=64, metadata={"help": "gsm8k_source=demo: train problems (test: eval_examples)"})
    calculator: bool = field(default=True, metadata={"help": "run nanochat's calculator tool inside sampling"})
    polar_dtype: str = field(
        default="auto", metadata={"help": "dtype of Muon's orthogonalisation: auto|bfloat16|float32"}
    )
    seed: int = field(default=42, metadata={"help": "seed of the Trainer (sampling seeds are chat_rl.py's)"})
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads per process, 1 to the cores (default: the cores idle when it starts, divided among "
            "the processes; as mid_train)"
        },
    )

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.device_batch_size < 1 or self.num_samples % self.device_batch_size:
            raise UserError(
                f"num_samples={self.num_samples} must be a positive multiple of device_batch_size="
                f"{self.device_batch_size} (each prompt's samples are generated and trained in whole passes)"
            )
        if self.examples_per_step < 1 or self.max_new_tokens < 1 or self.num_epochs < 1:
            raise UserError("examples_per_step, max_new_tokens and num_epochs must be positive")
        # what sampling can mean (chat_rl.py takes any number): temperature 0 is greedy, top_k 0 is off
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"temperature={self.temperature}: expected a number >= 0 (0: greedy)")
        if self.top_k < 0:
            raise UserError(f"top_k={self.top_k}: expected 0 (off) or a positive number of tokens")
        if self.eval_every > 0 and self.eval_examples < 1:
            raise UserError(f"eval_examples={self.eval_examples}: expected at least 1 (or eval_every -1: no pass@k)")
        if self.num_threads is not None:
            from ..training.device import check_num_threads

            check_num_threads(self.num_threads, f"num_threads={self.num_threads}")
        if self.gsm8k_source not in ("hub", "demo", "files"):
            raise UserError(f"gsm8k_source={self.gsm8k_source!r}: expected hub, demo or files")
        if self.gsm8k_source == "files" and not (self.train_data_files and self.eval_data_files):
            raise UserError("gsm8k_source=files needs train_data_files and eval_data_files")

    def optimizer_settings(self) -> dict[str, Any]:
        """`build_optimizer`'s keywords: HEAD's MuonAdamW (chat_rl.py's setup_optimizer), rates times init_lr_frac."""
        return {
            "recipe": "2026-07",
            "matrix_lr": self.matrix_lr,
            "embedding_lr": self.embedding_lr,
            "unembedding_lr": self.unembedding_lr,
            "weight_decay": self.weight_decay,
            "init_lr_frac": self.init_lr_frac,
            "polar_dtype": self.polar_dtype,
        }

    def grpo_config(self, num_train_rows: int, world_size: int):
        """The stock GRPOConfig of chat_rl.py's loop: on-policy REINFORCE with a group-mean baseline (beta 0, one
        iteration, rewards not scaled), one micro-batch per pass of one prompt, the linear schedule to 0 without
        warm-up, no clipping; ``max_steps`` = (train rows // examples_per_step) * num_epochs, as chat_rl.py."""
        import torch
        from trl import GRPOConfig

        if self.examples_per_step % world_size:
            raise UserError(
                f"examples_per_step={self.examples_per_step} is not divisible by the {world_size} processes"
            )
        steps = num_train_rows // self.examples_per_step * self.num_epochs
        if steps < 1:
            raise UserError(f"{num_train_rows} train rows make no step of examples_per_step={self.examples_per_step}")
        passes = self.examples_per_step // world_size * self.num_samples // self.device_batch_size
        return GRPOConfig(
            output_dir=self.output_dir,
            per_device_train_batch_size=self.device_batch_size,
            gradient_accumulation_steps=passes,
            steps_per_generation=passes,
            num_generations=self.num_samples,
            max_steps=steps,
            beta=0.0,
            num_iterations=1,
            scale_rewards="none",
            loss_type="bnpo",
            temperature=self.temperature,
            top_k=self.top_k,
            max_completion_length=self.max_new_tokens,
            mask_truncated_completions=False,
            shuffle_dataset=False,
            max_grad_norm=0.0,
            lr_scheduler_type="linear",
            warmup_steps=0,
            logging_steps=1,
            save_strategy="steps" if self.save_every > 0 else "no",
            save_steps=max(self.save_every, 1),
            report_to="none",
            disable_tqdm=True,
            seed=self.seed,
            bf16=False,
            # as mid_train: without CUDA or MPS say CPU, so that several processes (accelerate launch --multi_gpu,
            # torchrun) form one gloo group; else transformers leaves each process training alone (world size 1)
            use_cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()),
        )


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# each field's annotation (a string: postponed annotations) -> argparse's type and nargs
_TYPES = {"str": (str, None), "int": (int, None), "float": (float, None), "bool": (_bool, None)}
_TYPES |= {"str | None": (str, None), "int | None": (int, None), "list[str] | None": (str, "+")}
_NAMES = {str: "a string", int: "an integer", float: "a number", _bool: "true or false"}


def build_parser() -> OneLineArgumentParser:
    """A plain argparse parser of `RLArguments` (no transformers import: --help and argument errors answer at once)."""
    parser = OneLineArgumentParser(prog=PROG, description="nanochat's RL stage (chat_rl.py) on TRL's GRPOTrainer")
    add_version(parser)
    for f in dataclasses.fields(RLArguments):
        kind, nargs = _TYPES[f.type]
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        help_text = f.metadata["help"] + ("" if required else f" (default: {default})")
        parser.add_argument(f"--{f.name}", type=kind, nargs=nargs, default=default, required=required, help=help_text)
    return parser


def parse_args(argv: list[str] | None = None) -> RLArguments:
    """``[config.yaml] [--flag value ...]``: the YAML's values, then the flags (a flag wins)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0].endswith((".yaml", ".yml")):
        path = argv.pop(0)
        try:
            with open(path) as f:
                config = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            parser.error(f"config {path}: cannot be read ({type(e).__name__})")
        if not isinstance(config, dict):
            parser.error(f"config {path}: expected a mapping of argument: value")
        unknown = sorted(set(config) - {f.name for f in dataclasses.fields(RLArguments)})
        if unknown:
            parser.error(f"config {path}: unknown argument(s) {', '.join(unknown)}")
        for action in parser._actions:  # the config's values, typed as flags are; given, no longer required
            if action.dest in config and config[action.dest] is not None:
                value = config[action.dest]
                try:
                    if action.nargs == "+":
                        values = value if isinstance(value, list) else [value]
                        config[action.dest] = [action.type(str(v)) for v in values]
                    else:
                        config[action.dest] = action.type(str(value))
                except (ValueError, argparse.ArgumentTypeError):
                    parser.error(f"config {path}: {action.dest}={value!r}: expected {_NAMES[action.type]}")
            if action.dest in config:
                action.required = False
        parser.set_defaults(**config)
    namespace = vars(parser.parse_args(argv))
    try:
        return RLArguments(**namespace)
    except UserError as e:
        parser.error(str(e))
