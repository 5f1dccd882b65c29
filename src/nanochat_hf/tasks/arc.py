"""ARC (allenai/ai2_arc, configs ARC-Easy and ARC-Challenge): science multiple choice, evaluated categorically.
Labels "1".."4" are shown and scored as A..D (one answer-token format)."""

from __future__ import annotations

from .common import LETTERS, Problem, Task, render_mc


def problem(row: dict) -> Problem:
    """allenai/ai2_arc row: question, choices {text, label}, answerKey (a label: "A".. or "1"..)."""
    texts, labels = row["choices"]["text"], row["choices"]["label"]
    if row["answerKey"] not in labels:
        raise ValueError(f"answerKey {row['answerKey']!r} is not one of the labels {labels}")
    letters = LETTERS[: len(texts)]
    return Problem(
        [{"role": "user", "content": render_mc(row["question"], texts)}],
        letters[labels.index(row["answerKey"])],
        letters,
    )


def _arc(subset: str) -> Task:
    return Task(
        subset,
        "hub",
        dataset="allenai/ai2_arc",
        config=lambda split: subset,
        mode="categorical",
        baseline=0.25,
        problem=problem,
    )


EASY, CHALLENGE = _arc("ARC-Easy"), _arc("ARC-Challenge")
