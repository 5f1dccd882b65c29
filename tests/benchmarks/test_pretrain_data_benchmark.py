"""benchmarks/pretrain_data.py runs end to end at tiny sizes: the table's rows (reading, both tokenizers, which it
checks give the same ids, the stream, the step) and the stream's share of a step."""

from __future__ import annotations

import pytest
import torch

from .conftest import _load


@pytest.mark.slow  # a tokenizer trained, shards written, the model's step timed: 6-8 s of CPU
def test_prints_the_stream_against_the_step(capsys, monkeypatch):
    bench = _load("pretrain_data")
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")  # the benchmark sets it; restored after the test
    tiny = ["--depth", "1", "--seq", "64", "--vocab", "300", "--shards", "2", "--docs_per_shard", "400"]
    before = torch.get_num_threads()
    try:
        result = bench.main([*tiny, "--micro_batches", "300", "--docs", "128", "--repeats", "1"])
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert "| stream (read+tokenize+pack)  |" in out and "loader / step: " in out, out
    rows = result["rows"]
    assert list(rows) == [
        "read (datasets)",
        "tokenize (tokenizers)",
        "tokenize (tiktoken, HEAD's)",
        "stream (read+tokenize+pack)",
        "step d1 fwd+bwd",
    ]
    assert all(s > 0 for s in rows.values()) and result["docs_per_micro_batch"] > 0
    assert result["loader_per_step"] == rows["stream (read+tokenize+pack)"] / rows["step d1 fwd+bwd"]
