"""GSM8K scored exactly as nanochat scores it, on its own verdicts.

data/nanochat_gsm8k_rows.jsonl (hub layout) and data/nanochat_gsm8k_completions.json were written by nanochat's
tasks/gsm8k.py and tokenizer at 790f3be and 92d63d4 (same files): each completion is the token ids the engine
returns (terminal token left out), `tokenizer.decode` of them, and `GSM8K.evaluate`'s verdict for the problem at
that index of the seed-42 shuffle (`tests/make_nanochat_reference.py gsm8k`, see data/README.md). The tokenizer is
the one nanochat's tok_train.py wrote (tests/tokenizer/data/nanochat_92d63d4).
"""

import json
import re
from pathlib import Path

import pytest

from nanochat_hf.evaluation import load_problems
from nanochat_hf.inference import decode_completion, parts_from_tokens
from nanochat_hf.tasks import EVAL_TASKS
from nanochat_hf.tasks.gsm8k import check_final_number
from nanochat_hf.tokenizer import load_nanochat_tokenizer

DATA = Path(__file__).parent / "data"
CASES = json.loads((DATA / "nanochat_gsm8k_completions.json").read_text())


@pytest.fixture(scope="module")
def tok():
    return load_nanochat_tokenizer(
        Path(__file__).parents[1] / "tokenizer" / "data" / "nanochat_92d63d4", trust_pickle=True
    )


@pytest.fixture(scope="module")
def problems():
    return load_problems(EVAL_TASKS["GSM8K"], [str(DATA / "nanochat_gsm8k_rows.jsonl")])


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_same_completion_and_verdict_as_nanochat(tok, problems, case):
    # our reply tokens end with the stop token when generation stopped; nanochat's engine leaves it out
    tokens = case["tokens"] + ([tok.convert_tokens_to_ids("<|assistant_end|>")] if case["stopped"] else [])
    completion = decode_completion(tok, tokens)
    assert completion == case["completion"]
    assert check_final_number(problems[case["problem"]], completion) == bool(case["correct"])


def test_the_cases_that_tell_the_two_scorings_apart(tok, problems):
    verdicts = {c["completion"]: bool(c["correct"]) for c in CASES}
    assert verdicts["#### 10 first, then a second answer\n#### 11"]  # the first #### counts
    assert not verdicts["She earned 10.\n#### 10."]  # "10." is not "10"
    assert not verdicts["Let me check <|python_start|>#### 9<|python_end|> so\n#### 10"]  # inside a tool block
    # our former scoring (the last #### of the text parts, a trailing period dropped) gave the other verdict
    for case in CASES[1:4]:
        text = "".join(p["text"] for p in parts_from_tokens(tok, case["tokens"]) if p["type"] == "text")
        former = re.findall(r"#### (-?[0-9.,]+)", text)[-1].replace(",", "").rstrip(".")
        assert (former == problems[case["problem"]].answer) != bool(case["correct"])
