"""The `evaluate` metrics: ChatCORE over chat-eval outcomes, and exact match of greedy answers (mid_train's
SpellingBee accuracy). A module of their own, imported where a metric is computed: `evaluate` imports transformers'
pipelines, 0.35 s at every start of a training or evaluation process that computes none."""

from __future__ import annotations

import datasets
import evaluate

from ..tasks import EVAL_TASKS, task_by_name
from .chat_eval import TaskScore, chatcore


class ChatCORE(evaluate.Metric):
    """ChatCORE as an `evaluate` metric: add per-problem outcomes (``correct`` 0/1 and ``task`` name), compute
    per-task accuracy and ChatCORE (baselines from the task registry).

    >>> metric = ChatCORE()
    >>> metric.compute(correct=[1, 0, 1], task=["MMLU", "MMLU", "GSM8K"])["chatcore"]
    0.6666...
    """

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Mean over tasks of (accuracy - baseline) / (1 - baseline), nanochat's ChatCORE.",
            citation="",
            inputs_description="correct: 0/1 per problem; task: its chat-eval task name",
            features=datasets.Features({"correct": datasets.Value("int8"), "task": datasets.Value("string")}),
        )

    def _compute(self, correct: list[int], task: list[str]) -> dict:
        totals: dict[str, list[int]] = {}
        for ok, name in zip(correct, task):
            totals.setdefault(task_by_name(name).name, []).append(int(ok))
        scores = [
            TaskScore(name, EVAL_TASKS[name].mode, sum(v) / len(v), EVAL_TASKS[name].baseline, len(v))
            for name, v in totals.items()
        ]
        return {"chatcore": chatcore(scores), **{f"{s.task}/accuracy": s.accuracy for s in scores}}


class ExactMatch(evaluate.Metric):
    """Fraction of predictions equal to their reference after stripping whitespace.

    Defined locally because `evaluate.load("exact_match")` fetches its script from the hub (not offline).
    """

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="exact match after stripping surrounding whitespace",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions: list[str], references: list[str]) -> dict[str, float]:
        hits = [p.strip() == r.strip() for p, r in zip(predictions, references)]
        return {"exact_match": sum(hits) / max(len(hits), 1)}
