"""benchmarks/embedding_memory.py at tiny sizes: a bf16 embedding halves its weight + gradient bytes and saves
activation bytes in proportion to the layers (the residual stream is bf16 too)."""

from __future__ import annotations

import pytest
import torch


def test_bf16_embedding_saves_bytes_per_layer(embedding_memory, capsys):
    weights32, saved32 = embedding_memory.measure(2, 16, 2, 256, "cpu", torch.float32)
    weights16, saved16 = embedding_memory.measure(2, 16, 2, 256, "cpu", torch.bfloat16)
    assert weights32 == 2 * 256 * 128 * 4 and weights16 == weights32 // 2  # weight + gradient, width 128
    assert saved16 < saved32
    per_layer = embedding_memory.main(["--depth", "2", "--vocab", "256", "--layers", "1", "2", "--tokens", "16"])
    assert per_layer[0] == pytest.approx(per_layer[1]) and per_layer[0] >= 2 * 2 * 128  # two residuals, 2 B each
    assert "GiB less saved for backward" in capsys.readouterr().out
