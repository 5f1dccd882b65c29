"""The task registry: one Task per task, found by its mixture key or nanochat's name, used by the training mixture
and the chat evaluation alike: the same rows (seed-42 shuffle), the same conversion, the same one-line errors."""

import json

import pytest

from nanochat_hf.data import loads
from nanochat_hf.data.mixture import TaskSpec, load_mixture, load_task
from nanochat_hf.errors import UserError
from nanochat_hf.evaluation import load_problems
from nanochat_hf.tasks import EVAL_TASKS, MIXTURE_TASKS, DataLoadError, mixture_task, task_by_name
from nanochat_hf.tasks.gsm8k import final_number

GSM8K_ROWS = [
    {"question": f"What is {i} plus 1?", "answer": f"{i}+1=<<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"} for i in range(12)
]


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_one_task_object_for_the_mixture_and_the_chat_eval():
    for key, name in (("mmlu", "MMLU"), ("gsm8k", "GSM8K"), ("spelling_bee", "SpellingBee")):
        assert MIXTURE_TASKS[key] is EVAL_TASKS[name] is mixture_task(name) is task_by_name(key)
    assert mixture_task("CustomJSON") is mixture_task("identity") and mixture_task("Simple-Spelling").key == (
        "simple_spelling"
    )
    assert mixture_task("ARC-Easy") is None and mixture_task("HumanEval") is None  # evaluated, not trained
    with pytest.raises(UserError, match="unknown chat-eval task 'simple_spelling'; expected one of ARC-Easy"):
        task_by_name("simple_spelling")  # trained, not evaluated


def test_both_sides_read_the_same_shuffled_rows_and_the_same_answers(tmp_path):
    files = [_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)]
    problems = load_problems(EVAL_TASKS["GSM8K"], files, max_problems=5)
    result = load_task(TaskSpec(task="gsm8k", split="test", stop=5, data_files=files), cache_dir=str(tmp_path / "c"))
    conversations = [loads(r) for r in result.dataset]
    assert [c["messages"][0] for c in conversations] == [p.messages[0] for p in problems]
    assert [final_number(c["messages"][1]["content"][-1]["text"]) for c in conversations] == [
        p.answer for p in problems
    ]
    assert [p.messages[0]["content"] for p in problems] != [r["question"] for r in GSM8K_ROWS[:5]]  # shuffled


def test_unreadable_data_is_the_same_one_line_error_on_both_sides(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr("datasets.load_dataset", offline)
    tail = r"could not load openai/gsm8k/main split 'test' \(Couldn't reach 'openai/gsm8k' on the Hub "
    with pytest.raises(DataLoadError, match=rf"^GSM8K: {tail}"):
        load_problems(EVAL_TASKS["GSM8K"])
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(json.dumps({"tasks": [{"task": "gsm8k", "split": "test"}]}))
    with pytest.raises(DataLoadError, match=rf"^task gsm8k\[test\]: {tail}"):
        load_mixture(mixture)
    bad = tmp_path / "g.parquet"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(
        DataLoadError, match=r"^GSM8K: data file .*g.parquet is not a parquet file \(empty or damaged\)$"
    ):
        load_problems(EVAL_TASKS["GSM8K"], [str(bad)])
    assert issubclass(DataLoadError, UserError)  # the entry points print it in one line, exit code 2
