"""HumanEval (openai/openai_humaneval): write a Python function; a completion is correct when the task's tests
pass when run in the sandbox (`evaluation.sandbox`)."""

from __future__ import annotations

import re

from .common import Problem, Task


def problem(row: dict) -> Problem:
    """openai/openai_humaneval row: task_id, prompt (signature + docstring), test (defines check), entry_point."""
    for key in ("task_id", "prompt", "test", "entry_point"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"HumanEval row lacks a string {key!r}")
    return Problem(
        [{"role": "user", "content": row["prompt"]}],
        row["task_id"],
        program={"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]},
    )


def program(problem: Problem, reply: str) -> str:
    """The program HumanEval runs: the completion (code from a ``` block if there is one) with the prompt's
    imports, or appended to the prompt when it only writes the body; then the tests and check(entry_point)."""
    blocks = re.findall(r"```(?:python|py)?\n(.*?)```", reply, re.DOTALL)
    code = blocks[0] if blocks else reply
    prompt, entry = problem.program["prompt"], problem.program["entry_point"]
    if re.search(rf"^def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        imports = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        text = imports + "\n\n" + code
    else:
        text = prompt + code
    return f"{text}\n\n{problem.program['test']}\n\ncheck({entry})\n"


def check(problem: Problem, reply: str) -> bool:
    from ..evaluation.sandbox import run_program  # imported here: the evaluation package imports this one

    return run_program(program(problem, reply)).passed


TASK = Task("HumanEval", "hub", dataset="openai/openai_humaneval", mode="generative", problem=problem, check=check)
