"""benchmarks/threads.py runs end to end at tiny sizes and prints its table with the ratio to the baseline count."""

from __future__ import annotations

import pytest

from .conftest import _load


@pytest.fixture(scope="module")
def threads():
    return _load("threads")


def test_prints_table_with_ratios(threads, capsys):
    rows = threads.main(
        [
            "--depth",
            "1",
            "--vocab",
            "256",
            "--new_tokens",
            "3",
            "--rows",
            "2",
            "--seq",
            "16",
            "--repeats",
            "1",
            "--threads",
            "1,2",
        ]
    )
    out = capsys.readouterr().out
    assert "1-minute load average" in out and "| work | threads | tok/s | / 1 thread |" in out
    assert [(r["work"], r["threads"]) for r in rows] == [
        ("generate, batch 1", 1),
        ("generate, batch 1", 2),
        ("generate, batch 8", 1),
        ("generate, batch 8", 2),
        ("train step, 2 x 16", 1),
        ("train step, 2 x 16", 2),
    ]
    assert all(r["tok_s"] > 0 for r in rows) and [r["ratio"] for r in rows[::2]] == [1.0, 1.0, 1.0]
