"""base_train's command line without the training stack (as `cli.py` is mid_train's): its name and description, the
mid_train fields it refuses, and an instant answer to --help, --version and argument errors from
`ARGUMENTS_FILE`, a description of BaseTrainingArguments' parser written by
`python -m nanochat_hf.training.base_arguments` and checked against the real parser by the tests."""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import REFUSED, config_file, quick_answer

PROG = "base_train"
DESCRIPTION = "Pretrain nanochat's GPT (HEAD's base_train.py): base_train.py [config.yaml] [--flag value ...]"
ARGUMENTS_FILE = Path(__file__).with_name("base_train_arguments.json")

# mid_train's own fields that base_train does not read (it trains a fresh model on pretraining shards with HEAD's
# schedule, CORE and samples): hidden from --help and refused in one line when set, as mid_train's REFUSED fields
_CHAT_EVAL = "base_train samples HEAD's prompts (sample_every); chat evaluations are scripts/chat_eval.py's"
_CHATCORE = "base_train evaluates CORE (core_metric_every, core_metric_max_per_task), not ChatCORE"
_SOURCE = "base_train trains a fresh model sized by depth, aspect_ratio and head_dim"
MID_ONLY = {
    "model_source": _SOURCE,
    "step": _SOURCE,
    "checkpoint_source": _SOURCE,
    "inherit_from_base": _SOURCE,
    "load_optimizer": _SOURCE,
    "demo_depth": "use depth",
    "demo_generation": "base_train trains today's generation (G5)",
    "train_mixture": "base_train reads pretraining shards (data_dir)",
    "val_mixture": "base_train reads pretraining shards (data_dir)",
    "packing": "base_train packs HEAD's BOS-aligned best-fit rows",
    "completion_only_loss": "pretraining trains on every token",
    "init_lr_frac": "HEAD's schedule: warmup_steps, warmdown_ratio, final_lr_frac",
    "chatcore_every": _CHATCORE,
    "chatcore_max_cat": _CHATCORE,
    "chatcore_max_sample": _CHATCORE,
    "spelling_eval_rows": _CHAT_EVAL,
    "chat_eval_tasks": _CHAT_EVAL,
    "chat_eval_max_problems": _CHAT_EVAL,
    "sample_prompt": _CHAT_EVAL,
}
# what base_train refuses: mid_train's refusals but warmup_steps (HEAD's base_train has that knob), and MID_ONLY
BASE_REFUSED = {**{k: v for k, v in REFUSED.items() if k != "warmup_steps"}, **MID_ONLY}


def answer_quickly(argv: list[str] | None = None) -> None:
    """base_train's --help, --version and argument errors as the real parse says them, before torch and transformers
    are imported; returns when the command line parses (or only the real parse can tell)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quick_answer(argv, ARGUMENTS_FILE, PROG, DESCRIPTION, config_file, BASE_REFUSED)
