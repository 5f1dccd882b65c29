"""benchmarks/serve_load.py runs end to end at tiny sizes: for G0 and G5 the generate() loop and the server under
concurrent clients, every reply generate()'s; the abuse phases against G0; the tables printed and the run exits 0."""

from __future__ import annotations

import pytest

from .conftest import _load


@pytest.mark.slow
def test_prints_tables_with_no_failed_or_different_reply(capsys):
    serve_load = _load("serve_load")
    argv = ["--depth", "1", "--clients", "2", "--requests", "1", "--max-tokens", "6", "--repeats", "1"]
    assert serve_load.main([*argv, "--abuse-seconds", "2", "--disconnects", "3"]) == 0
    out = capsys.readouterr().out
    table = [line.split("|") for line in out.splitlines() if line.startswith("| G")]
    rows = {r[1].strip(): r[2:5] for r in table}
    for generation in ("G0", "G5"):
        assert f"{generation}: generate() loop, one request at a time" in rows
        requests, failed, different = (v.strip() for v in rows[f"{generation}: server, 2 clients"])
        assert (requests, failed, different) == ("2", "0", "0"), generation
    assert "| all under attack phases |" in out and "Ctrl-C to exit:" in out
