"""nanochat's chat evaluation (ARC, MMLU, GSM8K, HumanEval, SpellingBee; ChatCORE)."""

from .chat_eval import (
    ChatCORE,
    TaskScore,
    categorical_outcomes,
    chatcore,
    evaluate_task,
    generative_replies,
    model_index_results,
    report_section,
    results_table,
    run_chat_eval,
    scores_as_dicts,
    write_report_section,
)
from .sandbox import RunResult, run_program
from .tasks import EVAL_TASKS, EvalTask, Problem, load_problems, task_by_name

__all__ = [
    "ChatCORE",
    "EVAL_TASKS",
    "EvalTask",
    "Problem",
    "RunResult",
    "TaskScore",
    "categorical_outcomes",
    "chatcore",
    "evaluate_task",
    "generative_replies",
    "load_problems",
    "model_index_results",
    "report_section",
    "results_table",
    "run_chat_eval",
    "run_program",
    "scores_as_dicts",
    "task_by_name",
    "write_report_section",
]
