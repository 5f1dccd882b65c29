"""benchmarks/threads.py runs end to end at tiny sizes: a one-core job started and stopped for cases b and a, the
table with the default, 1 and all cores, the measured background load, and the default's ratio to the best forced
count."""

from __future__ import annotations

import pytest
import torch

from nanochat_hf.training.device import usable_cores

from .conftest import _load


@pytest.fixture(scope="module")
def threads():
    return _load("threads")


@pytest.mark.slow
def test_prints_each_case_with_the_background_load_and_the_ratio(threads, capsys):
    """Slow: the benchmark times generation at each thread count beside a background load it starts."""
    tiny = ["--depth", "1", "--vocab", "256", "--rows", "2", "--seq", "16", "--new_tokens", "3", "--repeats", "1"]
    before = torch.get_num_threads()
    try:
        rows = threads.main([*tiny, "--cases", "a,b"])
    finally:
        torch.set_num_threads(before)  # the benchmark leaves its last arm's count
    out = capsys.readouterr().out
    cores = len(usable_cores())
    forced = ["1 thread", f"{cores} threads"] if cores > 1 else ["1 thread"]
    header = f"| case | repeats | others | load | default (old rule) | work | {' | '.join(['default', *forced])} |"
    assert header + " default / best forced |" in out, out
    assert [(r["case"], r["work"]) for r in rows] == [
        ("a", "demo step (2 x 2 x 16 tokens)"),
        ("a", "generate 3 tokens"),
        ("b", "demo step (2 x 2 x 16 tokens)"),
        ("b", "generate 3 tokens"),
    ]
    for r in rows:
        assert r["repeats"] == 1 and 0 <= r["others"] <= cores
        assert 1 <= r["default"] <= cores and 1 <= r["old_rule"] <= cores
        assert r["ratio"] == pytest.approx(r["seconds"]["default"] / min(r["seconds"][arm] for arm in forced))
    assert out.count("(over 1.10)") == sum(r["ratio"] > 1.1 for r in rows)


def test_an_unknown_case_is_one_line(threads, capsys):
    with pytest.raises(SystemExit):
        threads.main(["--cases", "a,d"])
    expected = "--cases: unknown d; expected a comma list of a, b, c, now"
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected)
