"""The chat-evaluation tasks (nanochat's chat_eval set): loading, row -> problem, and the answer checkers.

Hub tasks load with `datasets` under nanochat's hub names and are shuffled with ``.shuffle(seed=42)`` right after
loading (so "the first 100 problems" are nanochat's first 100); ``data_files`` (json / jsonl / parquet in the
hub dataset's column layout) loads local copies instead. SpellingBee is synthetic (our `data.synthetic`, test
seeds). Categorical tasks are scored from the answer letters' logits; generative ones by a checker on the whole decoded
completion (tool blocks included), as nanochat's chat_eval.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from datasets import load_dataset
from datasets.exceptions import DatasetsError

from ..data import synthetic
from ..data.tasks import LETTERS, DataLoadError, check_data_file, gsm8k_conversation, mmlu_conversation, render_mc
from .sandbox import run_program

SPELLING_BEE_SIZE = 256  # test problems, as nanochat's chat_eval


@dataclass(frozen=True)
class Problem:
    messages: list[dict]  # the conversation up to the last user message
    answer: str  # the right letter (categorical), final number (GSM8K, SpellingBee) or the task id (HumanEval)
    letters: str = ""  # categorical: the choices' letters, compared at the answer position
    program: dict = field(default_factory=dict)  # HumanEval: prompt, test, entry_point


@dataclass(frozen=True)
class EvalTask:
    name: str
    mode: str  # "categorical" or "generative"
    baseline: float  # accuracy of random guessing: 0.25 for 4-way multiple choice, 0 for generative
    convert: Callable[[dict], Problem]
    dataset: str | None = None  # hub dataset; None for synthetic
    config: str | None = None
    split: str = "test"
    check: Callable[[Problem, str], bool] | None = None  # generative: (problem, reply text) -> correct


# ---------------------------------------------------------------- row -> problem


def arc_problem(row: dict) -> Problem:
    """allenai/ai2_arc row: question, choices {text, label}, answerKey (a label: "A".. or "1"..)."""
    texts, labels = row["choices"]["text"], row["choices"]["label"]
    if row["answerKey"] not in labels:
        raise ValueError(f"answerKey {row['answerKey']!r} is not one of the labels {labels}")
    letters = LETTERS[: len(texts)]  # labels "1".."4" are shown as A..D too (one answer-token format)
    return Problem(
        [{"role": "user", "content": render_mc(row["question"], texts)}],
        letters[labels.index(row["answerKey"])],
        letters,
    )


def mmlu_problem(row: dict) -> Problem:
    user, assistant = mmlu_conversation(row)["messages"]
    return Problem([user], assistant["content"], LETTERS[: len(row["choices"])])


_FINAL_NUMBER = re.compile(r"#### (-?[0-9.,]+)")


def final_number(text: str) -> str | None:
    """nanochat's extract_answer (tasks/gsm8k.py): the digits, dots and commas after the first ``#### `` of
    `text`, commas removed; None if there is none. Nothing else is normalized: "5." and "5.0" are not "5"."""
    found = _FINAL_NUMBER.search(text)
    return found.group(1).replace(",", "") if found else None


def gsm8k_problem(row: dict) -> Problem:
    """openai/gsm8k row: question, answer. The right answer is read, as nanochat does, from the answer's last text
    part (after its last ``<<...>>`` calculator call)."""
    user, assistant = gsm8k_conversation(row)["messages"]
    return Problem([user], final_number(assistant["content"][-1]["text"]))


def humaneval_problem(row: dict) -> Problem:
    """openai/openai_humaneval row: task_id, prompt (signature + docstring), test (defines check), entry_point."""
    for key in ("task_id", "prompt", "test", "entry_point"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"HumanEval row lacks a string {key!r}")
    return Problem(
        [{"role": "user", "content": row["prompt"]}],
        row["task_id"],
        program={"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]},
    )


def spelling_bee_problem(index: int) -> Problem:
    conversation = synthetic.spelling_bee(index, "test")
    user, assistant = conversation["messages"]
    return Problem([user], final_number(assistant["content"][-1]["text"]))


# ---------------------------------------------------------------- checkers


def check_final_number(problem: Problem, reply: str) -> bool:
    """nanochat's GSM8K (and SpellingBee) verdict: `reply` is the whole decoded completion, tool blocks included
    (`inference.decode_completion`), so a ``####`` inside a calculator call counts; no number on either side is
    a match too, as there (pred None == ref None)."""
    return final_number(reply) == problem.answer


def humaneval_program(problem: Problem, reply: str) -> str:
    """The program HumanEval runs: the completion (code from a ``` block if there is one) with the prompt's
    imports, or appended to the prompt when it only writes the body; then the tests and check(entry_point)."""
    blocks = re.findall(r"```(?:python|py)?\n(.*?)```", reply, re.DOTALL)
    code = blocks[0] if blocks else reply
    prompt, entry = problem.program["prompt"], problem.program["entry_point"]
    if re.search(rf"^def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        imports = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        program = imports + "\n\n" + code
    else:
        program = prompt + code
    return f"{program}\n\n{problem.program['test']}\n\ncheck({entry})\n"


def check_humaneval(problem: Problem, reply: str) -> bool:
    return run_program(humaneval_program(problem, reply)).passed


EVAL_TASKS = {
    t.name: t
    for t in (
        EvalTask("ARC-Easy", "categorical", 0.25, arc_problem, "allenai/ai2_arc", "ARC-Easy"),
        EvalTask("ARC-Challenge", "categorical", 0.25, arc_problem, "allenai/ai2_arc", "ARC-Challenge"),
        EvalTask("MMLU", "categorical", 0.25, mmlu_problem, "cais/mmlu", "all"),
        EvalTask("GSM8K", "generative", 0.0, gsm8k_problem, "openai/gsm8k", "main", check=check_final_number),
        EvalTask("HumanEval", "generative", 0.0, humaneval_problem, "openai/openai_humaneval", check=check_humaneval),
        EvalTask("SpellingBee", "generative", 0.0, None, check=check_final_number),
    )
}


def task_by_name(name: str) -> EvalTask:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for task in EVAL_TASKS.values():
        if re.sub(r"[^a-z0-9]", "", task.name.lower()) == key:
            return task
    raise ValueError(f"unknown chat-eval task {name!r}; expected one of {', '.join(EVAL_TASKS)}")


def load_problems(
    task: EvalTask, data_files: list[str] | None = None, max_problems: int | None = None, cache_dir: str | None = None
) -> list[Problem]:
    """The task's problems: shuffled with seed 42 right after loading, then the first `max_problems`."""
    if task.dataset is None:  # SpellingBee: synthetic test seeds
        n = SPELLING_BEE_SIZE if max_problems is None else min(max_problems, SPELLING_BEE_SIZE)
        return [spelling_bee_problem(i) for i in range(n)]
    # DataLoadError (a ValueError): the task's data cannot be read; callers skip the task or stop, in one line
    if data_files:
        builder = "parquet" if all(f.endswith(".parquet") for f in data_files) else "json"
        source = ", ".join(data_files)
        for path in data_files:
            check_data_file(path, task.name)
        try:
            ds = load_dataset(builder, data_files={task.split: list(data_files)}, split=task.split, cache_dir=cache_dir)
        except (DatasetsError, ValueError, OSError) as e:
            first = str(e.__cause__ or e).strip().splitlines() or [type(e).__name__]
            raise DataLoadError(
                f"{task.name}: data file(s) {source} cannot be read as {builder} ({first[0]})"
            ) from None
    else:
        source = f"{task.dataset}/{task.config}" if task.config else task.dataset
        try:
            ds = load_dataset(task.dataset, task.config, split=task.split, cache_dir=cache_dir)
        except (DatasetsError, ConnectionError, OSError) as e:
            raise DataLoadError(
                f"{task.name}: could not load {source} split {task.split!r} ({e}); offline? "
                f"give local files of the same layout with data_files"
            ) from None
    ds = ds.shuffle(seed=42)
    if max_problems is not None:
        ds = ds.select(range(min(max_problems, len(ds))))
    problems = []
    for i, row in enumerate(ds):
        try:
            problems.append(task.convert(row))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{task.name}: row {i} (after the seed-42 shuffle) of {source}: {e!r}") from None
    return problems
