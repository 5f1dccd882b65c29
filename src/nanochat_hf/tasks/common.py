"""What the tasks share: the `Task` record, the chat-evaluation `Problem`, the multiple-choice prompt, and the
seeds of synthetic rows (nanochat's `tasks/common.py` holds the same kind of things)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TEST_SEED_OFFSET = 10_000_000  # synthetic rows: seed = index for train, 10_000_000 + index otherwise (nanochat's)


def row_seed(index: int, split: str) -> int:
    return index if split == "train" else TEST_SEED_OFFSET + index


def render_mc(question: str, choices: list[str]) -> str:
    """nanochat's multiple-choice user message (no space between '=' and the letter)."""
    lines = "".join(f"- {choice}={letter}\n" for letter, choice in zip(LETTERS, choices))
    return f"Multiple Choice question: {question}\n{lines}\nRespond only with the letter of the correct answer."


@dataclass(frozen=True)
class Problem:
    """One chat-evaluation problem."""

    messages: list[dict]  # the conversation up to the last user message
    answer: str | None  # the right letter (categorical), final number (GSM8K, SpellingBee) or the task id (HumanEval)
    letters: str = ""  # categorical: the choices' letters, compared at the answer position
    program: dict = field(default_factory=dict)  # HumanEval: prompt, test, entry_point


def _no_config(split: str) -> str | None:
    return None


@dataclass(frozen=True)
class Task:
    """One task, defined once for the training mixture (``key``, ``conversation``) and the chat evaluation
    (``mode``, ``problem``, ``check``). Where its rows come from is ``kind``:

    - "hub": a hub dataset (``dataset``, ``config(split)``) or local files in its column layout; ``conversation(row)``
      and ``problem(row)`` take one row;
    - "synthetic": generated from seeds; ``conversation(index, split[, words])``, ``problem(index)`` (test seeds);
    - "file": a JSONL file of conversations; ``conversation(line)``.
    """

    name: str  # nanochat's name (its class or chat_eval name): "GSM8K", "ARC-Easy", "SpellingBee"
    kind: str  # "hub", "synthetic" or "file"
    key: str | None = None  # the mixture's name (`task:` in a mixture YAML, the rows' `task` column); None: eval only
    conversation: Callable[..., dict] | None = None  # one source row -> nanochat's {"messages": [...]}
    dataset: str | None = None  # hub dataset
    config: Callable[[str], str | None] = _no_config  # hub dataset config for a split
    words: bool = False  # synthetic: draws from a word list (data/words.py)
    default_file: Callable[[], Path] | None = None  # file: the file read when a mixture names none
    # the chat evaluation (mode None: the task is not evaluated)
    mode: str | None = None  # "categorical" (answer letters' logits) or "generative" (a checker on the completion)
    baseline: float = 0.0  # accuracy of random guessing: 0.25 for 4-way multiple choice, 0 for generative
    problem: Callable[[Any], Problem] | None = None
    check: Callable[[Problem, str], bool] | None = None  # generative: (problem, whole decoded completion) -> correct
    eval_split: str = "test"
    eval_size: int | None = None  # synthetic: the number of test problems

    @property
    def eval_config(self) -> str | None:
        return self.config(self.eval_split)
