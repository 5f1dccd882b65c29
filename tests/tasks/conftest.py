"""Fixtures for the task tests: rows in each hub dataset's column layout, a tiny tokenizer trained on their texts, a
datasets cache folder."""

import json
from pathlib import Path

import pytest

from nanochat_hf.tokenizer import train_tokenizer

MMLU_ROWS = [  # cais/mmlu: question, subject, choices, answer (index)
    {"question": "What is 2 + 2?", "subject": "math", "choices": ["3", "4", "5", "22"], "answer": 1},
    {"question": "Which gas do plants absorb?", "subject": "bio", "choices": ["O2", "CO2", "N2", "He"], "answer": 1},
    {"question": "Pick the last", "subject": "", "choices": ["a b", "c", "d", "e=f"], "answer": 3},
]
GSM8K_ROWS = [  # openai/gsm8k main: question, answer
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {"question": "What is 3 times 4?", "answer": "3*4=<<3*4=12>>12\n#### 12"},
]
SMOLTALK_ROWS = [  # HuggingFaceTB/smol-smoltalk: messages (+ source)
    {
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
        ],
        "source": "fixture",
    },
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And Italy?"},
            {"role": "assistant", "content": "Rome."},
        ],
        "source": "fixture",
    },
]
IDENTITY_ROWS = [
    [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am a fixture model."}],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "goodbye"},
    ],
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer():
    texts = [r["question"] for r in MMLU_ROWS + GSM8K_ROWS] + [
        m["content"] for r in SMOLTALK_ROWS for m in r["messages"]
    ]
    return train_tokenizer(texts * 5, vocab_size=400)


@pytest.fixture
def hf_cache(tmp_path) -> str:
    return str(tmp_path / "hf_cache")


@pytest.fixture(scope="session")
def fx():
    """This module: the fixture rows and `write_jsonl` (test modules cannot import conftest by name)."""
    import sys

    return sys.modules[__name__]
