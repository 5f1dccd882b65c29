"""benchmarks/generations.py at a tiny shape: both generations train and the table has their ratio."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_g5_against_g0_table(generations, capsys):
    threads = torch.get_num_threads()
    try:
        rows = generations.main(["--depth", "2", "--seq", "256", "--vocab", "256", "--batch", "1", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on 1 thread
    out = capsys.readouterr().out
    assert [r["generation"] for r in rows] == ["G0", "G5"] and rows[0]["ratio"] == 1.0
    assert all(r["tok_s"] > 0 for r in rows) and rows[1]["params"] > rows[0]["params"]  # value embeddings, gates
    assert "G5 layers: SL, short window 128" in out and "/ G0" in out
    g5 = generations.build("G5", 2, 256, 256, torch.device("cpu")).config
    assert g5.smear and g5.backout and g5.layer_types == ["sliding_attention", "full_attention"]
