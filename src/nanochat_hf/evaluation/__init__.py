"""nanochat's chat evaluation (ARC, MMLU, GSM8K, HumanEval, SpellingBee; ChatCORE) of `nanochat_hf.tasks`, and
DCLM CORE of a base model (`core.py`, as nanochat's base_eval)."""

from .chat_eval import (
    ChatCORE,
    TaskScore,
    categorical_outcomes,
    chatcore,
    evaluate_task,
    generative_replies,
    load_problems,
    model_index_results,
    report_section,
    results_table,
    run_chat_eval,
    scores_as_dicts,
    write_report_section,
)
from .core import evaluate_core
from .sandbox import RunResult, run_program

__all__ = [
    "ChatCORE",
    "RunResult",
    "TaskScore",
    "categorical_outcomes",
    "chatcore",
    "evaluate_core",
    "evaluate_task",
    "generative_replies",
    "load_problems",
    "model_index_results",
    "report_section",
    "results_table",
    "run_chat_eval",
    "run_program",
    "scores_as_dicts",
    "write_report_section",
]
