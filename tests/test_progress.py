"""nanochat_hf.progress on a log file (stderr not a terminal): what a long phase prints, with its ETA."""

from __future__ import annotations

import itertools

from nanochat_hf import progress as progress_mod
from nanochat_hf.progress import Progress


def _clock(monkeypatch, seconds: list[float]) -> None:
    times = itertools.chain(seconds, itertools.repeat(seconds[-1]))
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: next(times))


def test_long_phase_says_what_it_does_with_an_eta(monkeypatch, capsys):
    _clock(monkeypatch, [0.0, 10.0, 40.0, 75.0, 95.0, 100.0])  # start, then one reading per update, then close
    with Progress("chat eval GSM8K", total=8, unit="problems") as p:
        for _ in range(4):
            p.update(2)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "chat eval GSM8K: 8 problems",
        "chat eval GSM8K: 4/8 problems, 0:40 elapsed, eta 0:40",  # the first reading after 30 s
        "chat eval GSM8K: 6/8 problems, 1:15 elapsed, eta 0:25",
        "chat eval GSM8K: 8/8 problems in 1:40",
    ]


def test_short_unannounced_phase_prints_nothing(monkeypatch, capsys):
    _clock(monkeypatch, [0.0, 1.0, 2.0, 3.0])
    p = Progress("validation", total=3, unit="micro-batches", announce=False)
    assert list(p.wrap("abc")) == ["a", "b", "c"] and p.done == 3
    p.close()
    assert capsys.readouterr().err == ""


def test_other_processes_print_nothing(capsys):
    with Progress("chat eval MMLU", total=5, unit="problems", enabled=False) as p:
        p.update(5)
    assert capsys.readouterr().err == ""
