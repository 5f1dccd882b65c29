"""Fixtures: local rows of every chat-eval task in its hub column layout, a tokenizer that has a one-token
``####``, and "wired" tiny models whose greedy next token is a fixed function of the current token."""

from __future__ import annotations

import json

import pytest
import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.tokenizer import train_tokenizer

TEXTS = ["####", "#### 5", "#### 7", "The answer is 5.", "def add(a, b):\n    return a + b\n"] * 10

ARC_ROWS = [  # allenai/ai2_arc layout (labels are letters or digits)
    {
        "id": "a1",
        "question": "Which is a gas?",
        "choices": {"text": ["rock", "air", "wood", "iron"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
    {
        "id": "a2",
        "question": "What melts ice fastest on a warm day outside?",
        "choices": {"text": ["shade", "wind", "sun", "snow"], "label": ["1", "2", "3", "4"]},
        "answerKey": "3",
    },
    {
        "id": "a3",
        "question": "Plants need?",
        "choices": {"text": ["light", "sand", "salt"], "label": ["A", "B", "C"]},
        "answerKey": "A",
    },
    {
        "id": "a4",
        "question": "Which animal lays eggs?",
        "choices": {"text": ["dog", "hen", "cat", "cow"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
]
MMLU_ROWS = [  # cais/mmlu "all" layout
    {"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
    {"question": "Capital of France?", "subject": "geo", "choices": ["Rome", "Paris", "Oslo", "Bern"], "answer": 1},
    {"question": "H2O is?", "subject": "chem", "choices": ["salt", "acid", "water", "gold"], "answer": 2},
]
GSM8K_ROWS = [  # openai/gsm8k "main" layout
    {"question": "Ann has 2 apples and gets 3 more. How many?", "answer": "2+3=<<2+3=5>>5 apples.\n#### 5"},
    {"question": "Bo has 10 pens and gives away 3. How many are left?", "answer": "10-3=<<10-3=7>>7\n#### 7"},
    {"question": "What is 1,000 + 234?", "answer": "<<1000+234=1234>>1234\n#### 1,234"},
]
HUMANEVAL_ROWS = [  # openai/openai_humaneval layout
    {
        "task_id": "HumanEval/0",
        "prompt": 'import math\n\n\ndef add(a, b):\n    """Sum of a and b."""\n',
        "canonical_solution": "    return a + b\n",
        "entry_point": "add",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    },
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def data_files(tmp_path):
    """{task: [local jsonl]} for the hub tasks."""
    rows = {
        "ARC-Easy": ARC_ROWS,
        "ARC-Challenge": ARC_ROWS[::-1],
        "MMLU": MMLU_ROWS,
        "GSM8K": GSM8K_ROWS,
        "HumanEval": HUMANEVAL_ROWS,
    }
    return {task: [write_jsonl(tmp_path / f"{task}.jsonl", r)] for task, r in rows.items()}


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


def build_wired(tokenizer, *chains: list[str]) -> NanoChatGPTForCausalLM:
    """Tiny model whose greedy continuation of chain[i] is chain[i+1] (one-hot embeddings, blocks adding
    nothing at init, lm_head row dst = one-hot of src); every piece must be a single token."""
    vocab = len(tokenizer)
    config = NanoChatGPTConfig(sequence_len=128, vocab_size=vocab, n_layer=1, n_head=2, n_embd=320)
    model = NanoChatGPTForCausalLM(config).eval()

    def tid(piece: str) -> int:
        if piece.startswith("<|"):
            return tokenizer.convert_tokens_to_ids(piece)
        (idx,) = tokenizer.encode(piece, add_special_tokens=False)
        return idx

    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.eye(vocab, config.n_embd))
        model.lm_head.weight.zero_()
        for chain in chains:
            for a, b in zip(chain[:-1], chain[1:]):
                model.lm_head.weight[tid(b), tid(a)] = 1.0
    return model


@pytest.fixture
def random_model(tokenizer):
    config = NanoChatGPTConfig(sequence_len=128, vocab_size=len(tokenizer), n_layer=2, n_head=2, n_kv_head=1, n_embd=64)
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


@pytest.fixture
def wired(tokenizer):
    """build_wired bound to the session tokenizer: wired(chain, chain, ...) -> model."""
    return lambda *chains: build_wired(tokenizer, *chains)
