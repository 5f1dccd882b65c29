"""nanochat's chat evaluation (ARC, MMLU, GSM8K, HumanEval, SpellingBee; ChatCORE) of `nanochat_hf.tasks`, and
DCLM CORE of a base model (`core.py`, as nanochat's base_eval)."""

from ..lazy import lazy_exports
from .chat_eval import (
    TaskScore,
    categorical_outcomes,
    chatcore,
    evaluate_task,
    generative_replies,
    load_eval_problems,
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

# ChatCORE and ExactMatch on first use: their module imports `evaluate` (metrics.py)
__getattr__, __dir__ = lazy_exports(__name__, {"ChatCORE": "metrics", "ExactMatch": "metrics"})

__all__ = [
    "ChatCORE",
    "ExactMatch",
    "RunResult",
    "TaskScore",
    "categorical_outcomes",
    "chatcore",
    "evaluate_core",
    "evaluate_task",
    "generative_replies",
    "load_eval_problems",
    "load_problems",
    "model_index_results",
    "report_section",
    "results_table",
    "run_chat_eval",
    "run_program",
    "scores_as_dicts",
    "write_report_section",
]
