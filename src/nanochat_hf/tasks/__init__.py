"""The task registry: every task defined once (its rows' source, its training conversation, its chat-evaluation
problem and answer check), one module per task family, looked up here by the training mixture (`data/mixture.py`)
and the chat evaluation (`evaluation/chat_eval.py`) alike.

A task is found by its mixture key ("gsm8k", "spelling_bee") or nanochat's name ("GSM8K", "SpellingBee",
"CustomJSON"), in any case and with or without "-", "_" or spaces.
"""

from __future__ import annotations

import re

from ..errors import UserError
from . import arc, demo, gsm8k, humaneval, identity, mmlu, smoltalk, spelling
from .common import Problem, Task
from .hub import HUB_SHUFFLE_SEED, SOURCE_ROW, DataLoadError, check_data_file, hub_off, load_rows

TASKS: tuple[Task, ...] = (  # the evaluated ones first, in nanochat's chat_eval order (SpellingBee is ours)
    arc.EASY,
    arc.CHALLENGE,
    mmlu.TASK,
    gsm8k.TASK,
    humaneval.TASK,
    spelling.SPELLING_BEE,
    smoltalk.TASK,
    spelling.SIMPLE_SPELLING,
    identity.IDENTITY,
    identity.DEMO_IDENTITY,
    demo.ARITHMETIC,
    demo.MULTIPLE_CHOICE,
)
MIXTURE_TASKS = {t.key: t for t in sorted(TASKS, key=lambda t: t.key or "") if t.key}  # sorted by key
EVAL_TASKS = {t.name: t for t in TASKS if t.mode}
CHATCORE_TASKS = ("ARC-Easy", "ARC-Challenge", "MMLU", "GSM8K", "HumanEval")  # nanochat's ChatCORE (chat_sft.py)


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())  # "SpellingBee", "spelling-bee" -> "spellingbee"


def mixture_task(name: str) -> Task | None:
    """The mixture task called `name` (its key or nanochat's name), or None."""
    key = _normal(name)
    return next((t for t in MIXTURE_TASKS.values() if key in (_normal(t.key), _normal(t.name))), None)


def task_by_name(name: str) -> Task:
    """The chat-evaluation task called `name`; UserError naming the known ones otherwise."""
    key = _normal(name)
    for task in EVAL_TASKS.values():
        if key in {_normal(task.name), _normal(task.key or task.name)}:
            return task
    raise UserError(f"unknown chat-eval task {name!r}; expected one of {', '.join(EVAL_TASKS)}")


__all__ = [
    "CHATCORE_TASKS",
    "EVAL_TASKS",
    "HUB_SHUFFLE_SEED",
    "MIXTURE_TASKS",
    "SOURCE_ROW",
    "TASKS",
    "DataLoadError",
    "Problem",
    "Task",
    "check_data_file",
    "hub_off",
    "load_rows",
    "mixture_task",
    "task_by_name",
]
