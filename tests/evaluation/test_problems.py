import pytest
from datasets import load_dataset

from nanochat_hf.evaluation import load_problems
from nanochat_hf.tasks import EVAL_TASKS, spelling, task_by_name
from nanochat_hf.tasks.gsm8k import check_final_number, final_number


def test_rows_are_shuffled_with_seed_42_then_cut(data_files):
    problems = load_problems(EVAL_TASKS["MMLU"], data_files["MMLU"], max_problems=2)
    order = load_dataset("json", data_files=data_files["MMLU"], split="train").shuffle(seed=42)
    assert [p.messages[0]["content"].splitlines()[0] for p in problems] == [
        f"Multiple Choice question: {q}" for q in order["question"][:2]
    ]
    assert (
        load_problems(EVAL_TASKS["MMLU"], data_files["MMLU"])
        != load_problems(EVAL_TASKS["MMLU"], data_files["MMLU"])[::-1]
    )


def test_arc_rows_become_lettered_problems(data_files):
    problems = {
        p.messages[0]["content"].splitlines()[0]: p
        for p in load_problems(EVAL_TASKS["ARC-Easy"], data_files["ARC-Easy"])
    }
    digits = problems["Multiple Choice question: What melts ice fastest on a warm day outside?"]
    assert (digits.answer, digits.letters) == ("C", "ABCD")  # label "3" of "1".."4" is shown and scored as C
    assert "- sun=C\n" in digits.messages[0]["content"]
    three = problems["Multiple Choice question: Plants need?"]
    assert (three.answer, three.letters) == ("A", "ABC")


def test_mmlu_gsm8k_humaneval_spelling_bee(data_files):
    mmlu = load_problems(EVAL_TASKS["MMLU"], data_files["MMLU"])
    assert sorted(p.answer for p in mmlu) == ["B", "B", "C"] and {p.letters for p in mmlu} == {"ABCD"}
    gsm = load_problems(EVAL_TASKS["GSM8K"], data_files["GSM8K"])
    assert sorted(p.answer for p in gsm) == ["1234", "5", "7"]
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in gsm)
    (he,) = load_problems(EVAL_TASKS["HumanEval"], data_files["HumanEval"])
    assert he.answer == "HumanEval/0" and he.program["entry_point"] == "add"
    bee = load_problems(EVAL_TASKS["SpellingBee"], max_problems=3)
    for i, p in enumerate(bee):
        row = spelling.spelling_bee(i, "test")
        assert p.messages == row["messages"][:1]
        assert p.answer == row["messages"][1]["content"][-2]["text"]  # the python_output part: the count
    assert len(load_problems(EVAL_TASKS["SpellingBee"])) == 256


def test_bad_row_is_one_line_naming_task_row_and_file(tmp_path, data_files):
    bad = tmp_path / "arc_bad.jsonl"
    bad.write_text('{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "E"}\n')
    with pytest.raises(
        ValueError,
        match=r"ARC-Easy: row 0 \(after the seed-42 shuffle\) of .*arc_bad.jsonl: "
        r"ValueError\(\"answerKey 'E' is not one of the labels",
    ):
        load_problems(EVAL_TASKS["ARC-Easy"], [str(bad)])


def test_final_number_and_checker(data_files):
    # nanochat's extract_answer: the first ####, commas removed, nothing else (data/nanochat_gsm8k_* has its verdicts)
    assert final_number("so\n#### 1,234.") == "1234."
    assert final_number("#### 3 then #### -4") == "3"
    assert final_number("no answer") is None
    (five,) = [p for p in load_problems(EVAL_TASKS["GSM8K"], data_files["GSM8K"]) if p.answer == "5"]
    assert check_final_number(five, "2+3 is 5.\n#### 5")
    assert not check_final_number(five, "#### 6") and not check_final_number(five, "5")
    assert not check_final_number(five, "#### 5.") and not check_final_number(five, "#### 6\n#### 5")


def test_task_names():
    assert task_by_name("arc_easy").name == "ARC-Easy" and task_by_name("spellingbee").name == "SpellingBee"
    with pytest.raises(ValueError, match="unknown chat-eval task 'arc'; expected one of ARC-Easy, ARC-Challenge"):
        task_by_name("arc")
    assert [(t.name, t.baseline) for t in EVAL_TASKS.values()] == [
        ("ARC-Easy", 0.25),
        ("ARC-Challenge", 0.25),
        ("MMLU", 0.25),
        ("GSM8K", 0.0),
        ("HumanEval", 0.0),
        ("SpellingBee", 0.0),
    ]
