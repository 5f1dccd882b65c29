"""Shared fixtures for the data tests: a tiny tokenizer, a datasets cache folder."""

import logging

import pytest

from nanochat_hf.tokenizer import train_tokenizer

TEXTS = [
    "Spell the word: apple",
    "Multiple Choice question: What is 2 + 2?",
    "Respond only with the letter",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many r are in the word strawberry? hit! count=1 My final answer is:",
] * 5


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


@pytest.fixture
def hf_cache(tmp_path) -> str:
    return str(tmp_path / "hf_cache")


@pytest.fixture
def caplog_data(caplog):
    caplog.set_level(logging.INFO, logger="nanochat_hf.data")
    return caplog
