from __future__ import annotations

import pytest
import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

TINY = dict(sequence_len=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-zero random weights everywhere (a fresh model has zero c_proj/lm_head, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else 0.15))
    return model


@pytest.fixture
def make_model():
    def make(seed: int = 0, **overrides) -> NanoChatGPTForCausalLM:
        config = NanoChatGPTConfig(**{**TINY, "eos_token_id": 299, "pad_token_id": 298, **overrides})
        return randomize(NanoChatGPTForCausalLM(config), seed).eval()

    return make
