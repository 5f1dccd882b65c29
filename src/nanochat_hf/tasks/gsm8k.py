"""GSM8K (openai/gsm8k, config main): grade-school math with ``<<expr=result>>`` calculator annotations and a final
``#### N``. Trained as conversations whose calculator calls are python / python_output parts; evaluated
generatively by the final number, exactly as nanochat's `tasks/gsm8k.py` (`extract_answer`)."""

from __future__ import annotations

import re

from .common import Problem, Task

_CALC = re.compile(r"<<([^>]+)>>")
_FINAL_NUMBER = re.compile(r"#### (-?[0-9.,]+)")


def parts(answer: str) -> list[dict]:
    """GSM8K answer -> assistant parts: `<<expr=result>>` becomes python(expr) + python_output(result).

    Every annotation has a text part before it and the answer a text part after the last one, empty ones
    included (before a leading annotation, between two adjacent ones), as nanochat's conversations have.
    """
    out: list[dict] = []
    pos = 0
    for m in _CALC.finditer(answer):
        out.append({"type": "text", "text": answer[pos : m.start()]})
        expr, _, result = m.group(1).rpartition("=")
        if not _:  # no '=': the whole annotation is the expression
            expr, result = m.group(1), ""
        out.append({"type": "python", "text": expr})
        out.append({"type": "python_output", "text": result})
        pos = m.end()
    out.append({"type": "text", "text": answer[pos:]})
    return out


def conversation(row: dict) -> dict:
    question, answer = row["question"], row["answer"]
    if not isinstance(question, str) or not isinstance(answer, str):
        raise ValueError("question and answer must be strings")
    if "#### " not in answer:
        raise ValueError("answer has no final '#### ' line")
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": parts(answer)}]}


def final_number(text: str) -> str | None:
    """nanochat's extract_answer (tasks/gsm8k.py): the digits, dots and commas after the first ``#### `` of
    `text`, commas removed; None if there is none. Nothing else is normalized: "5." and "5.0" are not "5"."""
    found = _FINAL_NUMBER.search(text)
    return found.group(1).replace(",", "") if found else None


def final_number_problem(conversation: dict) -> Problem:
    """The problem of a conversation whose answer ends in ``#### N`` (GSM8K, SpellingBee): the user message, and
    the right answer read, as nanochat does, from the answer's last text part (after its last tool call)."""
    user, assistant = conversation["messages"]
    return Problem([user], final_number(assistant["content"][-1]["text"]))


def problem(row: dict) -> Problem:
    return final_number_problem(conversation(row))


def check_final_number(problem: Problem, reply: str) -> bool:
    """nanochat's GSM8K (and SpellingBee) verdict: `reply` is the whole decoded completion, tool blocks included
    (`inference.decode_completion`), so a ``####`` inside a calculator call counts; no number on either side is
    a match too, as there (pred None == ref None)."""
    return final_number(reply) == problem.answer


TASK = Task(
    "GSM8K",
    "hub",
    key="gsm8k",
    conversation=conversation,
    dataset="openai/gsm8k",
    config=lambda split: "main",
    mode="generative",
    problem=problem,
    check=check_final_number,
)
