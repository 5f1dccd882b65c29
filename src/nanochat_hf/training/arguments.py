"""`MidTrainingArguments`: nanochat's mid-training knobs on top of `TrainingArguments`.

nanochat's names and defaults (spec section 5) are the user-facing fields; `__post_init__` maps them onto the
`TrainingArguments` fields the `Trainer` actually reads (batch size, accumulation, max_steps, eval/save cadence,
precision), the way TRL's configs do.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from transformers import HfArgumentParser, TrainingArguments

DEMO_OUTPUT_DIR = "outputs/nanochat-hf-demo"

# Used when neither a config file nor --model_source is given: the small from-scratch CPU demo
# (configs/demo.yaml spells out the same values). Flags still override them.
DEMO_DEFAULTS = {
    "model_source": "demo",
    "max_seq_len": 256,
    "device_batch_size": 8,
    "total_batch_size": 4096,
    "eval_every": 50,
    "eval_tokens": 16384,
    "num_iterations": -1,
}


@dataclass
class MidTrainingArguments(TrainingArguments):
    # --- where the model comes from -------------------------------------------------------------------------
    model_source: str | None = field(
        default=None,
        metadata={"help": "None or 'demo': a small fresh model on the demo tokenizer; a nanochat base dir or "
                  "checkpoint dir (converted on the fly); a local Hugging Face model dir; or a hub repo id."},
    )
    model_tag: str | None = field(default=None, metadata={"help": "nanochat model tag (e.g. d20); default: largest"})
    step: int | None = field(default=None, metadata={"help": "nanochat checkpoint step; default: latest"})
    checkpoint_source: str = field(default="base", metadata={"help": "nanochat checkpoint kind: base or mid"})
    tokenizer_dir: str | None = field(default=None, metadata={"help": "nanochat tokenizer dir (default: beside)"})
    trust_pickle: bool = field(default=False, metadata={"help": "allow unpickling nanochat's tokenizer.pkl"})
    demo_depth: int = field(default=4, metadata={"help": "depth of the fresh demo model (model_source=demo)"})
    demo_n_embd: int = field(default=256, metadata={"help": "width of the fresh demo model"})
    # --- data -----------------------------------------------------------------------------------------------
    train_mixture: str | None = field(default=None, metadata={"help": "mixture YAML (None: offline demo mixture)"})
    val_mixture: str | None = field(default=None, metadata={"help": "validation mixture YAML (None: train_mixture)"})
    # --- nanochat's knobs (names and defaults of nanochat's mid_train) ----------------------------------------
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 autocast on CUDA, fp32 elsewhere), bfloat16, float32"})
    num_iterations: int = field(default=-1, metadata={"help": "optimizer steps; -1 = one epoch of the mixture"})
    max_seq_len: int = 2048
    device_batch_size: int = 32
    total_batch_size: int = field(default=524288, metadata={"help": "tokens per optimizer step, all ranks"})
    unembedding_lr: float = 0.004
    embedding_lr: float = 0.2
    matrix_lr: float = 0.02
    init_lr_frac: float = 1.0
    weight_decay: float = 0.0
    eval_every: int = field(default=150, metadata={"help": "evaluate val bpb every N steps (<=0: only at the end)"})
    eval_tokens: int = 20 * 524288
    dry_run: bool = field(default=False, metadata={"help": "train and log but write no checkpoint or model"})
    # --- extras -------------------------------------------------------------------------------------------
    num_threads: int | None = field(
        default=None,
        metadata={"help": "CPU threads per process (default: the cores this process may use / processes; "
                  "`accelerate launch` alone would pin OMP_NUM_THREADS=1)"},
    )
    peak_flops: float | None = field(default=None, metadata={"help": "device peak FLOP/s for MFU (default: known GPUs)"})
    spelling_eval_rows: int = field(default=64, metadata={"help": "held-out SimpleSpelling rows for exact match"})
    sample_prompt: str = field(default="Spell the word: apple", metadata={"help": "prompt of the final sample chat"})
    # --- TrainingArguments fields whose defaults differ for this recipe ------------------------------------
    output_dir: str | None = field(default=DEMO_OUTPUT_DIR)
    save_steps: float = field(default=0, metadata={"help": "write a resumable checkpoint every N steps (0: none)"})
    logging_steps: float = field(default=1, metadata={"help": "nanochat logs every step"})
    max_grad_norm: float = field(default=0.0, metadata={"help": "nanochat does not clip gradients"})
    eval_on_start: bool = field(default=True, metadata={"help": "nanochat evaluates at step 0"})
    report_to: None | str | list[str] = field(default="none")
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("device_batch_size", "max_seq_len", "total_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype={self.dtype!r}: expected one of auto, bfloat16, float32")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        tokens_per_micro = self.device_batch_size * self.max_seq_len * world
        if self.total_batch_size % tokens_per_micro:
            raise ValueError(
                f"total_batch_size={self.total_batch_size} is not divisible by device_batch_size*max_seq_len*"
                f"world_size = {self.device_batch_size}*{self.max_seq_len}*{world} = {tokens_per_micro}"
            )
        self.gradient_accumulation_steps = self.total_batch_size // tokens_per_micro
        self.per_device_train_batch_size = self.device_batch_size
        self.per_device_eval_batch_size = self.device_batch_size
        self.max_steps = self.num_iterations if self.num_iterations > 0 else -1
        self.num_train_epochs = 1
        if self.eval_every > 0:
            self.eval_strategy, self.eval_steps = "steps", self.eval_every
        else:  # evaluate once, at the end (MidTrainer asks for it)
            self.eval_strategy, self.eval_on_start = "no", False
        self.save_strategy = "steps" if self.save_steps > 0 and not self.dry_run else "no"
        if self.dry_run:
            self.push_to_hub = False
        # Device autodetection CUDA > MPS > CPU is Accelerate's; on a machine with neither, say CPU explicitly so
        # that several processes (torchrun / accelerate launch --multi_gpu without GPUs) form a gloo group.
        if not (torch.cuda.is_available() or torch.backends.mps.is_available()):
            self.use_cpu = True
        if self.use_cpu:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            torch.set_num_threads(self.num_threads or max(1, cores // world))
        # Precision: nanochat autocasts to bf16 on CUDA only; CPU/MPS default to fp32. Accelerate does the autocast.
        if self.dtype == "auto":
            self.bf16 = torch.cuda.is_available() and not self.use_cpu
        else:
            self.bf16 = self.dtype == "bfloat16"
        self.fp16 = False
        # The sharded optimizer averages gradients itself; see MidTrainer._prepare_for_training for DDP.
        # (The model has no buffers, so DDP has none to broadcast.)
        self.ddp_find_unused_parameters = False
        # Loss = mean per micro-batch / grad_accum (nanochat), no cross-rank token counting.
        self.average_tokens_across_devices = False
        # The per-rank data position is restored from the checkpoint, so the Trainer must not skip batches.
        self.ignore_data_skip = True
        self.remove_unused_columns = False
        self.dataloader_num_workers = 0
        super().__post_init__()


def parse_args(argv: list[str] | None = None) -> MidTrainingArguments:
    """Parse `[config.yaml] [--field value ...]`: YAML values become defaults, command-line flags override them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(MidTrainingArguments)
    if argv and argv[0].endswith((".yaml", ".yml")):
        path = Path(argv.pop(0))
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found")
        values = yaml.safe_load(path.read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"config file {path}: expected a mapping of argument names to values")
        known = {action.dest for action in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config file {path}: unknown argument(s) {', '.join(unknown)}")
        parser.set_defaults(**values)
    elif not any(a.split("=")[0] == "--model_source" for a in argv):
        parser.set_defaults(**DEMO_DEFAULTS)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    return args
