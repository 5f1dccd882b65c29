"""`MidTrainingArguments`: where every argument is defined and validated.

TRL's convention: a `TrainingArguments` subclass whose dataclass defaults are the recipe's (nanochat's
mid-training, spec'd in docs/), and a `__post_init__` that only checks and fills DERIVED values, never
overwrites a value the user gave. One name per knob:
- a `TrainingArguments` field that means the same as a nanochat knob is an ALIAS of it (`ALIASES`): either name
  may be given, both end up holding the value, and two different values are refused;
- a field this recipe does not use (nanochat has its own knob) is REFUSED when set (`REFUSED`), with one line
  naming the knob to use;
- every other field keeps its `TrainingArguments` meaning.
Parsing has no side effects (threads, devices are set up when training starts, in `MidTrainer`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from nanochat_hf.optim import POLAR_DTYPES, RECIPES
from nanochat_hf.tasks import EVAL_TASKS, task_by_name

from ..atomic import write_text
from ..errors import OneLineArgumentParser, UserError, add_version, one_line
from .cli import (
    ALIASES,
    ARGUMENTS_FILE,
    DEMO_CONFIG,
    DESCRIPTION,
    PROG,
    REFUSED,
    HelpFormatter,
    config_defaults,
    config_for,
    describe,
    flags,
    own_help,
)
from .ddp_timeout import DDPTimeoutOnEveryBackendMixin
from .device import check_num_threads, cpu_threads
from .inherit import find_meta, inherit, inheritance_lines, warm_start_lines


class _OneLineParser(OneLineArgumentParser, HfArgumentParser):
    """HfArgumentParser with argument errors in one line (`mid_train: error: ...`)."""


@dataclass
class MidTrainingArguments(DDPTimeoutOnEveryBackendMixin, TrainingArguments):
    # --- where the model comes from -------------------------------------------------------------------------
    model_source: str | None = field(
        default=None,
        metadata={
            "help": "None or 'demo': a small fresh model on the demo tokenizer; a nanochat base dir or "
            "checkpoint dir (converted on the fly); a local Hugging Face model dir; or a hub repo id."
        },
    )
    model_tag: str | None = field(default=None, metadata={"help": "nanochat model tag (e.g. d20); default: largest"})
    step: int | None = field(default=None, metadata={"help": "nanochat checkpoint step; default: latest"})
    checkpoint_source: str = field(
        default="base",
        metadata={
            "help": "which folder of a nanochat base dir model_source reads: base (base_checkpoints), sft "
            "(chatsft_checkpoints), rl (chatrl_checkpoints), or mid (mid_checkpoints: nanochat before 1ddaad1, "
            "January 2026)"
        },
    )
    tokenizer_dir: str | None = field(default=None, metadata={"help": "nanochat tokenizer dir (default: beside)"})
    trust_pickle: bool = field(default=False, metadata={"help": "allow unpickling nanochat's tokenizer.pkl"})
    demo_depth: int = field(
        default=4,
        metadata={
            "help": "depth of the fresh demo model (model_source=demo); nanochat's rule sets the rest: width 64*depth, "
            "ceil(width/128) heads"
        },
    )
    demo_generation: str = field(
        default="G0",
        metadata={
            "help": "nanochat model generation of the fresh demo model: G0 (December 2025) to G5 (today's: value "
            "embeddings, SSSL sliding windows, smear, backout), built and initialised as nanochat builds it"
        },
    )
    # --- data -----------------------------------------------------------------------------------------------
    train_mixture: str | None = field(default=None, metadata={"help": "mixture YAML (None: offline demo mixture)"})
    val_mixture: str | None = field(default=None, metadata={"help": "validation mixture YAML (None: train_mixture)"})
    packing: str = field(
        default="stream",
        metadata={
            "help": "stream: conversations concatenated into one token stream cut into rows (nanochat's December "
            "mid-training); bestfit: BOS-aligned best-fit rows padded, never cropped (nanochat's SFT at HEAD)"
        },
    )
    completion_only_loss: bool = field(
        default=False,
        metadata={
            "help": "train on the assistant's completions only (nanochat's SFT); false: on every token (December "
            "mid-training)"
        },
    )
    inherit_from_base: bool = field(
        default=False,
        metadata={
            "help": "take max_seq_len, device_batch_size, total_batch_size and the three LRs that are not given from "
            "the base checkpoint's meta JSON, as nanochat's chat_sft.py does (the run prints which)"
        },
    )
    # --- nanochat's knobs (names and defaults of nanochat's mid_train) ----------------------------------------
    dtype: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 autocast on CUDA, fp32 elsewhere), bfloat16, "
            "float32; --bf16 true is the same as bfloat16"
        },
    )
    embedding_dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype of the token embedding while training: auto (bfloat16 when training on CUDA with bf16 "
            "autocast, as nanochat does; otherwise as loaded), bfloat16 (needs bf16 autocast), float32"
        },
    )
    num_iterations: int | None = field(
        default=None, metadata={"help": "optimizer steps; -1 = one epoch of the mixture (alias: max_steps)"}
    )
    max_seq_len: int = field(default=2048, metadata={"help": "tokens per row of a micro-batch (packed conversations)"})
    device_batch_size: int | None = field(
        default=None, metadata={"help": "rows per micro-batch per process (alias: per_device_train_batch_size)"}
    )
    total_batch_size: int = field(
        default=524288,
        metadata={"help": "tokens per optimizer step, all ranks; gradient_accumulation_steps is derived from it"},
    )
    unembedding_lr: float = field(
        default=0.004, metadata={"help": "AdamW learning rate of lm_head (scaled by (width/768)^-0.5, as nanochat)"}
    )
    embedding_lr: float = field(
        default=0.2,
        metadata={"help": "AdamW learning rate of the token embedding (scaled by (width/768)^-0.5, as nanochat)"},
    )
    matrix_lr: float = field(default=0.02, metadata={"help": "Muon learning rate of every transformer.h matrix"})
    init_lr_frac: float = field(
        default=1.0,
        metadata={
            "help": "the learning rates start at this fraction of the "
            "above (nanochat's schedule then holds, then decays to 0)"
        },
    )
    warmdown_ratio: float = field(
        default=0.2,
        metadata={
            "help": "the LR decays linearly to 0 over this last fraction of the run (December mid-training 0.2, "
            "SFT at HEAD 0.5)"
        },
    )
    weight_decay: float = field(
        default=0.0,
        metadata={
            "help": "AdamW weight decay (embedding, lm_head); with optimizer_recipe 2026-07 the Muon groups' "
            "(the AdamW groups then have nanochat's fixed ones)"
        },
    )
    optimizer_recipe: str = field(
        default="2025-12",
        metadata={
            "help": "2025-12: nanochat's December Muon + AdamW; 2026-07: nanochat HEAD's MuonAdamW (Polar Express, "
            "NorMuon, cautious weight decay, per-group betas and weight decay)"
        },
    )
    polar_dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype of Muon's orthogonalisation, both recipes: auto (bfloat16 on CUDA from SM 8.0 and, for "
            "recipe 2025-12, on CPUs that multiply bfloat16 natively, measured at the start; float32 where bfloat16 "
            "is emulated, 40-70x slower, and for 2026-07 off CUDA, as nanochat HEAD); bfloat16 (nanochat's December "
            "numbers on every device); float32"
        },
    )
    nanochat_optimizer: str | None = field(
        default=None,
        metadata={
            "help": "warm-start the optimizer from nanochat's optim_<step>_rank0.pt (G0-era or HEAD format; each "
            "process reads the file of its rank): momentum buffers and moments, and a HEAD file's group settings "
            "(e.g. the base run's last Muon weight decay) with recipe 2026-07; the LRs stay this run's"
        },
    )
    load_optimizer: bool | None = field(
        default=None,
        metadata={
            "help": "warm-start from the optimizer files beside the nanochat checkpoint of model_source "
            "(chat_sft.py's --load-optimizer), as --nanochat_optimizer does; unset: true with optimizer_recipe "
            "2026-07 (chat_sft.py's default), false with 2025-12 (December mid_train.py starts fresh)"
        },
    )
    eval_every: int | None = field(
        default=None, metadata={"help": "evaluate val bpb every N steps, <=0: only at the end (alias: eval_steps)"}
    )
    eval_tokens: int = field(default=20 * 524288, metadata={"help": "validation tokens read at each evaluation"})
    chatcore_every: int = field(
        default=-1,
        metadata={
            "help": "ChatCORE (nanochat's five chat-eval tasks) at the evaluation of every N-th step and at the last "
            "step; -1: never (tasks whose data cannot be loaded are skipped, saying so)"
        },
    )
    chatcore_max_cat: int = field(
        default=-1, metadata={"help": "ChatCORE: at most this many problems per categorical task (-1: all)"}
    )
    chatcore_max_sample: int = field(
        default=24, metadata={"help": "ChatCORE: at most this many problems per generative task (-1: all)"}
    )
    dry_run: bool = field(default=False, metadata={"help": "train and log but write no checkpoint or model"})
    # --- extras -------------------------------------------------------------------------------------------
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads per process, 1 to the cores (default: the cores idle when the run starts, divided "
            "among the processes; `accelerate launch` alone would pin OMP_NUM_THREADS=1)"
        },
    )
    fully_shard: bool = field(
        default=False,
        metadata={
            "help": "FSDP2 without Accelerate's FSDP (which runs on GPUs only): fully_shard each decoder block and the "
            "root before training, so parameters, gradients and optimizer state are 1/W per process (CPU gloo "
            "processes, or torchrun); needs several processes; on GPUs prefer --config_file "
            "configs/accelerate_fsdp2.yaml"
        },
    )
    peak_flops: float | None = field(
        default=None, metadata={"help": "device peak FLOP/s for MFU (default: known GPUs)"}
    )
    spelling_eval_rows: int = field(default=64, metadata={"help": "held-out SimpleSpelling rows for exact match"})
    chat_eval_tasks: str | None = field(
        default=None,
        metadata={
            "help": f"comma list of chat-eval tasks run after training ({', '.join(EVAL_TASKS)}; the hub ones need "
            "their data); results go to report.md and the model card"
        },
    )
    chat_eval_max_problems: int | None = field(
        default=None, metadata={"help": "at most this many problems per chat-eval task (default: all)"}
    )
    sample_prompt: str = field(default="Spell the word: apple", metadata={"help": "prompt of the final sample chat"})
    # --- TrainingArguments fields whose defaults are the recipe's -----------------------------------------
    output_dir: str | None = field(
        default="outputs/nanochat-hf-demo",
        metadata={"help": "where the model, report.md, model card and checkpoint-<step> folders are written"},
    )
    # (transformers 5 dropped this TrainingArguments flag; same name and meaning as its 4.x one)
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "allow an output_dir that holds another run (its files are replaced as this run writes its own)"
        },
    )
    max_steps: int = field(default=-1, metadata={"help": "alias of num_iterations"})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "alias of device_batch_size"})
    per_device_eval_batch_size: int | None = field(
        default=None,
        metadata={"help": "validation rows per micro-batch: nanochat uses device_batch_size (the default)"},
    )
    gradient_accumulation_steps: int | None = field(
        default=None, metadata={"help": "derived: total_batch_size / (device_batch_size * max_seq_len * processes)"}
    )
    num_train_epochs: float = 1.0
    bf16: bool | None = field(default=None, metadata={"help": "alias of dtype=bfloat16 (false: float32)"})
    eval_strategy: str = field(default="steps", metadata={"help": "steps (every eval_every steps) or no"})
    eval_steps: float | None = field(default=150, metadata={"help": "alias of eval_every"})
    eval_on_start: bool = field(default=True, metadata={"help": "nanochat evaluates at step 0"})
    save_strategy: str | None = field(default=None, metadata={"help": "default: steps when save_steps > 0, else no"})
    save_steps: float = field(default=0, metadata={"help": "write a resumable checkpoint every N steps (0: none)"})
    logging_steps: float = field(default=1, metadata={"help": "nanochat logs every step"})
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "a non-finite loss stops the run (nanochat does not filter it)"}
    )
    max_grad_norm: float = field(default=0.0, metadata={"help": "nanochat does not clip gradients"})
    average_tokens_across_devices: bool = False
    ignore_data_skip: bool = True
    enable_jit_checkpoint: bool = field(
        default=True,
        metadata={
            "help": "on SIGTERM (a cluster's preemption): checkpoint at the end of the running step, say how to "
            "resume, exit 143 without writing the final model (false: SIGTERM ends the run at once)"
        },
    )
    remove_unused_columns: bool = False
    ddp_find_unused_parameters: bool | None = False
    report_to: None | str | list[str] = field(default="none")
    seed: int = 42
    use_cache: bool = field(
        default=True,
        metadata={  # the Trainer writes it into the config the model is saved with
            "help": "the saved config's use_cache: generate() keeps a KV cache by default (training never builds one)"
        },
    )

    def __post_init__(self) -> None:
        self._refuse_unused()
        self._resolve_aliases()
        self._check_nanochat_knobs()
        self._derive()
        try:
            super().__post_init__()
        except ValueError as e:  # transformers' own checks of its fields (e.g. save_steps vs eval_steps)
            raise UserError(one_line(e)) from None

    # ---- validation steps (each raises ValueError with one line) ------------------------------------------
    def _refuse_unused(self, refused: dict[str, str] = REFUSED) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, hint in refused.items():
            value = getattr(self, name)
            if value != defaults[name] and str(value) != str(defaults[name]):
                raise UserError(f"{name}={value} is not used by this recipe: {hint}")

    def _resolve_aliases(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for knob, hf in ALIASES.items():
            ours, theirs, default = getattr(self, knob), getattr(self, hf), defaults[hf]
            if ours is None:
                setattr(self, knob, int(theirs) if theirs is not None else theirs)
            elif theirs not in (default, ours):
                theirs = int(theirs) if float(theirs).is_integer() else theirs
                raise UserError(f"{knob}={ours} and {hf}={theirs} conflict: they are the same setting, give one")
            else:
                setattr(self, hf, ours)
        if self.bf16 is not None:
            wanted = "bfloat16" if self.bf16 else "float32"
            if self.dtype not in ("auto", wanted):
                raise UserError(f"dtype={self.dtype} and bf16={self.bf16} conflict: they are the same setting")
            self.dtype = wanted
        if self.per_device_eval_batch_size not in (None, self.device_batch_size):
            raise UserError(
                f"per_device_eval_batch_size={self.per_device_eval_batch_size}: validation uses "
                f"device_batch_size ({self.device_batch_size}), as nanochat does"
            )

    def _check_nanochat_knobs(self) -> None:
        if self.optimizer_recipe not in RECIPES:
            raise UserError(f"optimizer_recipe={self.optimizer_recipe}: expected one of {', '.join(RECIPES)}")
        for name in ("device_batch_size", "max_seq_len", "total_batch_size", "eval_tokens", "demo_depth"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.polar_dtype not in POLAR_DTYPES:
            raise UserError(f"polar_dtype={self.polar_dtype!r}: expected one of {', '.join(POLAR_DTYPES)}")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise UserError(f"dtype={self.dtype!r}: expected one of auto, bfloat16, float32")
        if self.embedding_dtype not in ("auto", "bfloat16", "float32"):
            raise UserError(f"embedding_dtype={self.embedding_dtype!r}: expected one of auto, bfloat16, float32")
        if self.num_iterations == 0 or self.num_iterations < -1:
            raise UserError(f"num_iterations={self.num_iterations}: expected -1 (one epoch) or a positive count")
        if self.packing not in ("stream", "bestfit"):
            raise UserError(f"packing={self.packing!r}: expected stream or bestfit")
        if self.chatcore_every > 0 and self.eval_every > 0 and self.chatcore_every % self.eval_every:
            raise UserError(
                f"chatcore_every={self.chatcore_every} must be a multiple of eval_every="
                f"{self.eval_every} (ChatCORE runs with the evaluations)"
            )
        if not 0 < self.warmdown_ratio <= 1:
            raise UserError(f"warmdown_ratio={self.warmdown_ratio}: expected a fraction in (0, 1]")
        if self.max_grad_norm < 0:
            raise UserError(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0: no clipping)")
        for name in self.chat_eval_task_list:
            task_by_name(name)  # one line naming the unknown task and the known ones
        if self.chat_eval_max_problems is not None and self.chat_eval_max_problems <= 0:
            raise UserError(f"chat_eval_max_problems={self.chat_eval_max_problems} must be a positive integer")
        check_num_threads(self.num_threads, f"num_threads={self.num_threads}")
        if self.fully_shard:
            self._check_fully_shard()

    @property
    def _accelerate_fsdp(self) -> bool:
        """Whether `accelerate launch` runs with an FSDP config (read as Accelerate's own state reads it)."""
        return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"

    def _check_fully_shard(self) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise UserError(
                "fully_shard=true needs several processes (accelerate launch --multi_gpu --num_processes N, or "
                "torchrun): one process has nothing to shard across"
            )
        if self.fsdp or self._accelerate_fsdp:
            raise UserError(
                "fully_shard=true together with Accelerate's FSDP (an fsdp config or --fsdp): Accelerate shards the "
                "model itself there; drop --fully_shard"
            )
        if self.embedding_dtype == "bfloat16":
            raise UserError(
                "embedding_dtype=bfloat16 with fully_shard=true: FSDP2 shards the embedding with the root's other "
                "float32 parameters, which must share one dtype; keep embedding_dtype auto"
            )

    @property
    def chat_eval_task_list(self) -> list[str]:
        return [t.strip() for t in (self.chat_eval_tasks or "").split(",") if t.strip()]

    def _derive(self) -> None:
        """Fill the fields that follow from the others (never one the user set: those were checked above)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        tokens_per_micro = self.device_batch_size * self.max_seq_len * world
        if self.total_batch_size % tokens_per_micro:
            raise UserError(
                f"total_batch_size={self.total_batch_size} is not divisible by device_batch_size*max_seq_len*"
                f"world_size = {self.device_batch_size}*{self.max_seq_len}*{world} = {tokens_per_micro}"
            )
        accumulation = self.total_batch_size // tokens_per_micro
        if self.gradient_accumulation_steps not in (None, accumulation):
            raise UserError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} conflicts with "
                f"total_batch_size: {self.total_batch_size} / ({tokens_per_micro} tokens per micro-batch"
                f" on all processes) = {accumulation}; set total_batch_size instead"
            )
        self.gradient_accumulation_steps = accumulation
        self.per_device_eval_batch_size = self.device_batch_size
        if self.eval_every <= 0:  # evaluate once, at the end (the run asks for it)
            self.eval_strategy, self.eval_on_start = "no", False
        if self.save_strategy is None:
            self.save_strategy = "steps" if self.save_steps > 0 else "no"
        if self.dry_run:
            self.save_strategy, self.push_to_hub = "no", False
        if self.metric_for_best_model and self.greater_is_better is None and "bpb" in self.metric_for_best_model:
            self.greater_is_better = False  # bits per byte: lower is better (the stock guess is "not a loss")
        # Device autodetection CUDA > MPS > CPU is Accelerate's; on a machine with neither, say CPU explicitly so
        # that several processes (torchrun / accelerate launch --multi_gpu without GPUs) form a gloo group.
        if not (torch.cuda.is_available() or torch.backends.mps.is_available()):
            self.use_cpu = True
        # nanochat autocasts to bf16 on CUDA only; CPU/MPS default to fp32. Accelerate does the autocast.
        if self.dtype == "auto":
            self.bf16 = torch.cuda.is_available() and not self.use_cpu
        else:
            self.bf16 = self.dtype == "bfloat16"
        if self.embedding_dtype == "bfloat16" and not self.bf16:
            raise UserError(
                "embedding_dtype=bfloat16 needs bf16 autocast (dtype=bfloat16, or auto on CUDA): in "
                "float32 the embedding's bfloat16 output cannot feed the float32 layers"
            )

    def settle_num_threads(self) -> list[str]:
        """On CPU, the thread count measured now (`cpu_threads`) becomes num_threads, which the trainer sets when
        training starts; the line saying how many and why (none on a GPU). Reads the device: call it once."""
        if self.device.type != "cpu":
            return []
        self.num_threads, line = cpu_threads(self.num_threads, self.world_size)
        return [line]

    @property
    def embedding_torch_dtype(self) -> torch.dtype | None:
        """The token embedding's dtype for training, None to keep it as loaded. Reads the device: call it once
        training is set up, not at parse time."""
        if self.embedding_dtype == "auto":
            # FSDP2 (ours or Accelerate's) shards the embedding with the root's float32 parameters: one dtype
            fsdp2 = self.fully_shard or self._accelerate_fsdp
            return torch.bfloat16 if self.bf16 and self.device.type == "cuda" and not fsdp2 else None
        return getattr(torch, self.embedding_dtype)


def config_values(path: str | os.PathLike | None = None) -> dict:
    """Each argument's value before any flag: a config file's (the demo config's when None) over the dataclass
    defaults, an alias pair resolved. `scripts/preview_data.py` shows the batch arithmetic of a run from these."""
    defaults = {
        f.name: f.default for f in dataclasses.fields(MidTrainingArguments) if f.default is not dataclasses.MISSING
    }
    values = {**defaults, **config_defaults(Path(path) if path else DEMO_CONFIG, set(defaults))}
    for knob, hf in ALIASES.items():
        if values[knob] is None:
            values[knob] = values[hf]
    return values


def _parser() -> _OneLineParser:
    """MidTrainingArguments' parser, as `cli.ARGUMENTS_FILE` describes it (no config values, no help edits yet)."""
    return _OneLineParser(MidTrainingArguments, prog=PROG, formatter_class=HelpFormatter, description=DESCRIPTION)


def parse_args(argv: list[str] | None = None) -> MidTrainingArguments:
    """Parse `[config.yaml] [--field value ...]`: the config's values become defaults, flags override them.

    Without a config file, the demo config is the defaults unless --model_source names a real model (then the
    dataclass defaults, nanochat's recipe, apply). (`cli.answer_quickly` does the same without the training stack.)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    known = {action.dest for action in parser._actions}
    config = config_for(argv, known, _OneLineParser([], prog=PROG, add_help=False))
    parser.set_defaults(**config)
    inherited, meta_path = _inherit_from_base(parser, set(config) | flags(argv), argv)
    add_version(parser)
    own_help(parser)
    args, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:  # argparse's own wording, as every other entry point says it
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    lines = inheritance_lines(args, inherited, meta_path) if inherited is not None else []
    lines += warm_start_lines(args)
    if int(os.environ.get("RANK", "0")) == 0:
        for line in lines:
            print(f"mid_train: {line}", flush=True)
    return args


def _inherit_from_base(parser: HfArgumentParser, given: set[str], argv: list[str]) -> tuple[dict | None, Path | None]:
    """With inherit_from_base: the meta values of the inherited arguments that neither the config nor a flag
    gives (`given`) become defaults. (None, None) without inherit_from_base."""
    peek = _OneLineParser([], prog=PROG, add_help=False)
    for name, kind in (
        ("inherit_from_base", string_to_bool),
        ("model_source", str),
        ("model_tag", str),
        ("step", int),
        ("checkpoint_source", str),
    ):
        nargs = {"nargs": "?", "const": True} if kind is string_to_bool else {}  # a bare --inherit_from_base
        peek.add_argument(f"--{name}", type=kind, default=parser.get_default(name), **nargs)
    seen = peek.parse_known_args(argv)[0]
    if not seen.inherit_from_base:
        return None, None
    given = given | {knob for knob, hf in ALIASES.items() if hf in given}
    meta_path = find_meta(seen.model_source, seen.model_tag, seen.step, seen.checkpoint_source)
    inherited = inherit(meta_path, given, seen.model_source)
    parser.set_defaults(**inherited)
    return inherited, meta_path


def write_arguments_file() -> None:
    """(Re)write `cli.ARGUMENTS_FILE` from MidTrainingArguments; run it after changing an argument or transformers:
    `python -m nanochat_hf.training.arguments` (a test says so when the file is out of date)."""
    write_text(ARGUMENTS_FILE, json.dumps(describe(_parser()), indent=1) + "\n")


if __name__ == "__main__":
    write_arguments_file()
    print(f"wrote {ARGUMENTS_FILE}")
