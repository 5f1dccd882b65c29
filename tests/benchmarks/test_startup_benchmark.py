"""benchmarks/startup.py runs end to end and prints its table with the ratio to the baseline (import torch)."""

from __future__ import annotations

import pytest

from .conftest import _load


@pytest.mark.slow
def test_prints_table_with_ratios(capsys):
    """Slow: the benchmark times fresh interpreters, which is what it measures."""
    rows = _load("startup").main(["--repeats", "1", "--scripts", "convert"])
    out = capsys.readouterr().out
    assert "1-minute load average before" in out and "| case | seconds | / import torch |" in out
    assert [r["case"] for r in rows] == [
        "import torch",
        "import nanochat_hf",
        "convert --help",
        "convert --version",
        "convert --no-such-flag",
    ]
    assert rows[0]["ratio"] == 1.0 and all(r["seconds"] > 0 for r in rows)
