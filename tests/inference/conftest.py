"""Fixtures: a tiny trained tokenizer and "wired" tiny models whose greedy next token is a fixed function of
the current token (so generation follows a script through the real forward and KV cache, no patching)."""

from __future__ import annotations

import pytest
import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.tokenizer import train_tokenizer

TEXTS = ["hello there, how are you?", "The answer is 5.", "Let me compute 12*7+3 with the calculator."] * 5


@pytest.fixture(scope="session")
def tokenizer():
    tok = train_tokenizer(TEXTS, vocab_size=300)
    assert len(tok) <= 300
    return tok


def tid(tokenizer, piece: str) -> int:
    """Id of a special token, or of a one-character piece (byte b has id b)."""
    if piece.startswith("<|"):
        return tokenizer.convert_tokens_to_ids(piece)
    (idx,) = tokenizer.encode(piece, add_special_tokens=False)
    return idx


def build_wired(tokenizer, *chains: list[str]) -> NanoChatGPTForCausalLM:
    """Tiny model whose greedy continuation of chain[i] is chain[i+1], for each chain (a token leads to one
    next token only; a token with no successor is followed by id 0).

    Embedding = one-hot of the token id and the blocks add nothing (nanochat init zeroes c_proj), so the
    final hidden state is a scaled one-hot of the current token; lm_head row dst holds a 1 at column src.
    """
    vocab = len(tokenizer)
    config = NanoChatGPTConfig(sequence_len=64, vocab_size=vocab, n_layer=1, n_head=2, n_embd=320)
    model = NanoChatGPTForCausalLM(config).eval()
    pairs = [(tid(tokenizer, a), tid(tokenizer, b)) for chain in chains for a, b in zip(chain[:-1], chain[1:])]
    sources = [src for src, _ in pairs]
    assert len(set(sources)) == len(sources), "a token may lead to one next token only"
    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.eye(vocab, config.n_embd))
        model.lm_head.weight.zero_()
        for src, dst in pairs:
            model.lm_head.weight[dst, src] = 1.0
    return model


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (a fresh model's zero c_proj/lm_head would hide cache bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else 0.3))
    return model


@pytest.fixture
def conversation():
    return {"messages": [{"role": "user", "content": "What is 2+3?"}]}


@pytest.fixture
def wired(tokenizer):
    """build_wired bound to the session tokenizer: wired(chain, chain, ...) -> model."""
    return lambda *chains: build_wired(tokenizer, *chains)


@pytest.fixture
def ids(tokenizer):
    """ids("<|python_start|>", "2", ...) -> list of token ids."""
    return lambda *pieces: [tid(tokenizer, p) for p in pieces]


@pytest.fixture
def random_model(tokenizer):
    config = NanoChatGPTConfig(sequence_len=64, vocab_size=len(tokenizer), n_layer=2, n_head=2, n_kv_head=1, n_embd=64)
    return randomize(NanoChatGPTForCausalLM(config)).eval()
