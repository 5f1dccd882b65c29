"""benchmarks/serve_steps.py runs end to end at a tiny size: another commit's batcher (from git) and ours, driven
step by step on the same model, each row of the table timed for both; an unknown commit is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import _load

ROWS = [
    "decoding step, 1 request(s), 14-44 columns",
    "decoding step, 8 request(s), 14-44 columns",
    "decoding step, the long request alone (~560 columns)",
    "a short request's prefill and join beside it",
    "decoding step, the long request and the short one",
    "the step where the short one leaves",
]
pytestmark = pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / ".git").exists(), reason="reads the baseline batcher from git"
)


@pytest.mark.slow
def test_prints_every_row_for_both_batchers(capsys):
    serve_steps = _load("serve_steps")
    assert serve_steps.main(["--against", "HEAD", "--depth", "1", "--repeats", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms," not in line]
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines]
    assert [row[0] for row in table] == ROWS
    for _, old, new, ratio in table:
        assert float(old.split()[0]) > 0 and float(new.split()[0]) > 0 and float(ratio) > 0


def test_an_unknown_commit_is_one_line():
    serve_steps = _load("serve_steps")
    with pytest.raises(SystemExit, match=r"^--against no-such-commit: fatal: "):
        serve_steps.main(["--against", "no-such-commit", "--depth", "1"])
