"""MMLU (cais/mmlu): multiple-choice questions. Trained on `auxiliary_train` (nanochat's mixture), evaluated on
`all` test (categorical: the answer letter's logit)."""

from __future__ import annotations

from .common import LETTERS, Problem, Task, render_mc


def conversation(row: dict) -> dict:
    row = row["train"] if "train" in row else row  # auxiliary_train wraps each row in a `train` column
    question, choices, answer = row["question"], row["choices"], row["answer"]
    if not isinstance(question, str) or not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ValueError("question must be a string and choices a list of strings")
    if not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ValueError(f"answer {answer!r} is not an index into {len(choices)} choices")
    return {
        "messages": [
            {"role": "user", "content": render_mc(question, choices)},
            {"role": "assistant", "content": LETTERS[answer]},
        ]
    }


def problem(row: dict) -> Problem:
    user, assistant = conversation(row)["messages"]
    return Problem([user], assistant["content"], LETTERS[: len(row["choices"])])


TASK = Task(
    "MMLU",
    "hub",
    key="mmlu",
    conversation=conversation,
    dataset="cais/mmlu",
    config=lambda split: "auxiliary_train" if split == "train" else "all",
    mode="categorical",
    baseline=0.25,
    problem=problem,
)
