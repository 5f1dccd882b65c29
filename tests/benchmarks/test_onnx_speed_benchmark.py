"""benchmarks/onnx_speed.py runs end to end at tiny sizes: its table has the three rows, and the float32 export
picks the torch model's tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("generation", ["G0", "G5"])
@pytest.mark.slow
def test_prints_table_and_float32_picks_torchs_tokens(onnx_speed, capsys, generation):
    """Slow: each generation is exported to ONNX and timed in onnxruntime and torch, as the benchmark does."""
    args = ["--generation", generation, "--depth", "1", "--vocab", "512", "--prompt_len", "6", "--new_tokens", "8"]
    rows = onnx_speed.main([*args, "--repeats", "1"])
    out = capsys.readouterr().out
    assert f"{generation} d1" in out and "1 thread(s)" in out and "load average" in out and "x torch" in out
    assert [r["name"] for r in rows] == ["torch generate()", "onnxruntime float32", "onnxruntime int8"]
    assert rows[0]["ratio"] == 1.0 and all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[1]["same_tokens"] == 8 and 0 <= rows[2]["same_tokens"] <= 8
