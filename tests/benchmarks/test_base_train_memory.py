"""benchmarks/base_train_memory.py: the fake-tensor estimate equals the same step on real tensors (the method's
validation), counts the parameters a rank holds, and leaves no process group or patch behind."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist

from nanochat_hf.model import NanoChatGPTForCausalLM
from nanochat_hf.optim import reduction
from nanochat_hf.training.base import base_model_config

pytestmark = pytest.mark.slow  # 4 tiny training steps, fake and real, in two modes (several seconds)


def test_fake_estimate_equals_real_tensors(base_train_memory):
    learned_order = reduction.GradientReducer._learned_order
    with base_train_memory.estimating(8):
        peaks = {
            (mode, fake): base_train_memory.peak(1, 2, mode, seq=64, vocab=512, fake=fake)
            for mode in ("zero2", "fsdp2")
            for fake in (True, False)
        }
    assert not dist.is_initialized() and reduction.GradientReducer._learned_order is learned_order
    for mode in ("zero2", "fsdp2"):
        assert peaks[(mode, True)] == peaks[(mode, False)], mode
    # ZeRO-2 keeps every parameter whole, float32 but for the bfloat16 token embedding
    args = types.SimpleNamespace(depth=1, aspect_ratio=64, head_dim=128, max_seq_len=64, window_pattern="SSSL")
    model = NanoChatGPTForCausalLM(base_model_config(args, base_train_memory._Tokenizer(512)))
    wte = model.get_input_embeddings().weight.numel()
    expected = 4 * sum(p.numel() for p in model.parameters()) - 2 * wte
    zero2 = base_train_memory.kinds(peaks[("zero2", True)])
    assert zero2["params"] == expected
    assert zero2["total"] == sum(zero2[k] for k in ("params", "grads", "state", "activations", "comm")) > expected
    assert torch.get_default_dtype() == torch.float32
