"""benchmarks/serve_load.py runs end to end at tiny sizes: both servers start, every reply is generate()'s, the
table is printed and the run exits 0."""

from __future__ import annotations

import pytest

from .conftest import _load


@pytest.mark.slow
def test_prints_table_with_no_failed_or_different_reply(capsys):
    serve_load = _load("serve_load")
    argv = ["--depth", "1", "--clients", "3", "--seconds", "30", "--max-requests", "2", "--max-tokens", "6"]
    assert serve_load.main(argv) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| server")]
    assert [r[1].strip() for r in rows] == ["server, 3 clients", "server --continuous-batching, 3 clients"]
    assert all((r[2].strip(), r[3].strip(), r[4].strip()) == ("6", "0", "0") for r in rows)
