"""`BaseTrainingArguments`: base_train's arguments, nanochat HEAD's `scripts/base_train.py` knobs (92d63d4) under
their names with underscores and with their defaults, all in this one class.

A `MidTrainingArguments` (the same aliases, refusals, checks and config files), with HEAD's pretraining defaults
and its knobs added. What HEAD derives from the model (total_batch_size -1, the number of steps) is filled in by
`base.plan_run` once the tokenizer and the model's size are known.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_text
from ..errors import UserError, add_version
from .arguments import MidTrainingArguments, _OneLineParser
from .base_cli import ARGUMENTS_FILE, BASE_REFUSED, DESCRIPTION, PROG
from .checkpoint.layout import checkpoint_name
from .cli import HelpFormatter, config_file, describe, own_help
from .fp8 import check_fp8

# HEAD's knobs (its user_config in a checkpoint's meta), in its order
HEAD_KNOBS = (
    "run", "device_type", "fp8", "fp8_recipe", "depth", "aspect_ratio", "head_dim", "max_seq_len", "window_pattern",
    "num_iterations", "target_flops", "target_param_data_ratio", "device_batch_size", "total_batch_size",
    "embedding_lr", "unembedding_lr", "weight_decay", "matrix_lr", "scalar_lr", "warmup_steps", "warmdown_ratio",
    "final_lr_frac", "resume_from_step", "eval_every", "eval_tokens", "core_metric_every", "core_metric_max_per_task",
    "sample_every", "save_every", "model_tag",
)  # fmt: skip


@dataclass
class BaseTrainingArguments(MidTrainingArguments):
    # --- logging and runtime --------------------------------------------------------------------------------
    run: str = field(default="dummy", metadata={"help": "wandb run name ('dummy': no wandb; else report_to wandb)"})
    device_type: str = field(default="", metadata={"help": "cuda|cpu|mps (empty: autodetect)"})
    fp8: bool = field(
        default=False, metadata={"help": "FP8 training, HEAD's (H100-class GPUs: CUDA compute capability 8.9+)"}
    )
    fp8_recipe: str = field(
        default="tensorwise",
        metadata={"help": "FP8 scaling recipe: tensorwise (HEAD's fp8.py has no other: rowwise is refused)"},
    )
    # --- model architecture ---------------------------------------------------------------------------------
    depth: int = field(default=20, metadata={"help": "depth of the Transformer model"})
    aspect_ratio: int = field(
        default=64, metadata={"help": "model_dim = depth * aspect_ratio (rounded up to head_dim)"}
    )
    head_dim: int = field(default=128, metadata={"help": "target head dimension for attention"})
    window_pattern: str = field(
        default="SSSL", metadata={"help": "sliding window pattern tiled across layers: L=full, S=half context"}
    )
    # --- training horizon (the first one set wins: num_iterations, target_flops, target_param_data_ratio) -------
    target_flops: float = field(default=-1.0, metadata={"help": "num_iterations to reach these FLOPs (-1: off)"})
    target_param_data_ratio: float = field(
        default=12.0, metadata={"help": "num_iterations for this tokens : scaling-params ratio (-1: off)"}
    )
    # --- optimization ---------------------------------------------------------------------------------------
    total_batch_size: int = field(
        default=-1, metadata={"help": "tokens per optimizer step, all ranks (-1: HEAD's rule from the model's size)"}
    )
    embedding_lr: float = field(default=0.3, metadata={"help": "AdamW learning rate of the embeddings"})
    unembedding_lr: float = field(default=0.008, metadata={"help": "AdamW learning rate of lm_head"})
    weight_decay: float = field(default=0.28, metadata={"help": "Muon's cautious weight decay (scaled as HEAD)"})
    matrix_lr: float = field(default=0.02, metadata={"help": "Muon learning rate of the matrices"})
    scalar_lr: float = field(default=0.5, metadata={"help": "AdamW learning rate of resid_lambdas, x0_lambdas"})
    warmup_steps: int = field(default=40, metadata={"help": "steps of linear LR warm-up"})
    warmdown_ratio: float = field(default=0.65, metadata={"help": "fraction of the steps of linear LR warm-down"})
    final_lr_frac: float = field(default=0.05, metadata={"help": "final LR as a fraction of the initial LR"})
    resume_from_step: int = field(
        default=-1, metadata={"help": "resume from output_dir/checkpoint-<step> (-1: no; see resume_from_checkpoint)"}
    )
    optimizer_recipe: str = field(default="2026-07", metadata={"help": "nanochat HEAD's MuonAdamW"})
    # --- evaluation -----------------------------------------------------------------------------------------
    eval_steps: float | None = field(default=250, metadata={"help": "alias of eval_every"})
    eval_tokens: int = field(default=80 * 524288, metadata={"help": "validation tokens read at each evaluation"})
    core_metric_every: int = field(default=2000, metadata={"help": "CORE metric every N steps (-1: off)"})
    core_metric_max_per_task: int = field(default=500, metadata={"help": "examples per task for the CORE metric"})
    sample_every: int = field(default=2000, metadata={"help": "sample from the model every N steps (-1: off)"})
    save_every: int = field(default=-1, metadata={"help": "checkpoint every N steps (-1: only the final model)"})
    # --- data (nanochat's layout) ---------------------------------------------------------------------------
    data_dir: str | None = field(
        default=None,
        metadata={"help": "folder of shard_NNNNN.parquet (default: $NANOCHAT_BASE_DIR/base_data_climbmix, else hub)"},
    )
    tokenizer_dir: str | None = field(
        default=None,
        metadata={"help": "tokenizer folder: HF files or HEAD's tokenizer.pkl (default: $NANOCHAT_BASE_DIR/tokenizer)"},
    )
    demo_data: bool = field(
        default=False,
        metadata={
            "help": "when data_dir holds no shards: write synthetic ones there, and a tokenizer trained on them into "
            "tokenizer_dir (offline demo)"
        },
    )
    demo_vocab_size: int = field(default=2048, metadata={"help": "vocabulary of the demo tokenizer (demo_data)"})
    output_dir: str | None = field(default="outputs/base", metadata={"help": "where the model and checkpoints go"})

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise UserError(f"depth={self.depth}: expected a positive number of layers")
        for name in ("aspect_ratio", "head_dim", "core_metric_max_per_task"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)} must be a positive integer")
        if not self.window_pattern or set(self.window_pattern.upper()) - {"S", "L"}:
            raise UserError(f"window_pattern={self.window_pattern!r}: expected letters S and L, e.g. SSSL")
        if self.fp8_recipe not in ("tensorwise", "rowwise"):
            raise UserError(f"fp8_recipe={self.fp8_recipe!r}: expected tensorwise or rowwise")
        if self.device_type not in ("", "cuda", "cpu", "mps"):
            raise UserError(f"device_type={self.device_type!r}: expected cuda, cpu, mps or empty (autodetect)")
        self.use_cpu = self.use_cpu or self.device_type == "cpu"
        if self.run != "dummy":
            self.report_to, self.run_name = "wandb", self.run
        if self.save_every > 0:
            self.save_steps = self.save_every
        if self.resume_from_step >= 0:
            self.resume_from_checkpoint = str(Path(self.output_dir) / checkpoint_name(self.resume_from_step))
        auto_batch = self.total_batch_size == -1
        if auto_batch:  # checked once HEAD's rule has set it (base.plan_run)
            self.total_batch_size = 1
        try:
            super().__post_init__()
        finally:
            if auto_batch:
                self.total_batch_size, self.gradient_accumulation_steps = -1, None
        if self.num_iterations <= 0 and self.target_flops <= 0 and self.target_param_data_ratio <= 0:
            raise UserError("no training horizon: set num_iterations, target_flops or target_param_data_ratio > 0")
        if self.warmup_steps < 0:
            raise UserError(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not 0 <= self.final_lr_frac <= 1:
            raise UserError(f"final_lr_frac={self.final_lr_frac}: expected a fraction in [0, 1]")
        if self.fp8:
            check_fp8(self.fp8_recipe, self.device)
            if self.fully_shard or self.fsdp or self._accelerate_fsdp:
                raise UserError(
                    "fp8=true with FSDP (fully_shard, --fsdp or an Accelerate FSDP config): the fp8 layers multiply "
                    "whole weights, not shards (HEAD has no FSDP); drop --fp8 or the sharding"
                )

    def _refuse_unused(self, refused: dict[str, str] = BASE_REFUSED) -> None:
        super()._refuse_unused(refused)

    def _derive(self) -> None:
        if self.total_batch_size != 1:  # 1: HEAD's rule decides it later (see __post_init__)
            return super()._derive()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.total_batch_size = self.device_batch_size * self.max_seq_len * world
        super()._derive()


def _parser() -> _OneLineParser:
    """BaseTrainingArguments' parser, as `base_cli.ARGUMENTS_FILE` describes it (no config values, no help edits)."""
    return _OneLineParser(BaseTrainingArguments, prog=PROG, formatter_class=HelpFormatter, description=DESCRIPTION)


def parse_base_args(argv: list[str] | None = None) -> BaseTrainingArguments:
    """`[config.yaml] [--field value ...]`: the config's values become defaults, flags override them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    parser.set_defaults(**(config_file(argv, {action.dest for action in parser._actions}) or {}))
    add_version(parser)
    own_help(parser, BASE_REFUSED)
    args, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


if __name__ == "__main__":  # (re)write base_cli.ARGUMENTS_FILE after changing an argument or transformers
    write_text(ARGUMENTS_FILE, json.dumps(describe(_parser()), indent=1) + "\n")
    print(f"wrote {ARGUMENTS_FILE}")
