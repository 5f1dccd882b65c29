"""benchmarks/throughput.py at a tiny shape: both loops run (in this process, eager) and the table has every column."""

from __future__ import annotations

import pytest
import torch

COLUMNS = [
    "loop",
    "compile",
    "processes",
    "tok/s",
    "/ base",
    "compile s",
    "peak MiB/rank",
    "/ base",
    "opt MiB/rank",
    "MFU",
]


def test_table_prints_every_column(throughput, tmp_path, capsys):
    depth, vocab = 1, 256
    argv = [
        "--depth",
        str(depth),
        "--vocab",
        str(vocab),
        "--seq",
        "16",
        "--batch",
        "2",
        "--grad_accum",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--peak_tflops",
        "0.001",
        "--compile",
        "eager",
        "--processes",
        "1",
    ]
    threads = torch.get_num_threads()
    try:  # the workers' own entry point, in this process: a fresh process per arm costs ~10 s of imports each
        for loop in ("baseline", "midtrainer"):
            assert throughput.main([*argv, "--worker", loop, "--result", str(tmp_path / loop)]) == []
    finally:
        torch.set_num_threads(threads)  # a worker runs on 1 thread
    rows = [throughput.collect(tmp_path / loop, loop, False, 1) for loop in ("baseline", "midtrainer")]
    capsys.readouterr()
    throughput.print_tables(throughput.parse(argv), rows)
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| loop"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    cells = {
        c[0]: c
        for c in (
            [x.strip() for x in line.strip("|").split("|")]
            for line in lines
            if line.startswith(("| nanochat loop", "| MidTrainer"))
        )
    }
    assert set(cells) == {"nanochat loop", "MidTrainer"}
    for name, row in cells.items():
        assert len(row) == len(COLUMNS) and row[1:3] == ["eager", "1"], row
        assert float(row[3].replace(",", "")) > 0 and float(row[6].replace(",", "")) > 100  # tok/s, RSS MiB
        assert row[5] == "n/a" and row[9].endswith("%") and float(row[9][:-1]) > 0  # compile s, MFU
    assert cells["nanochat loop"][4] == cells["nanochat loop"][7] == "1.00"
    # optimizer state: AdamW's two fp32 moments of wte and lm_head, Muon's fp32 momentum of every block matrix
    model = throughput.build_model(throughput.parse(argv), torch.device("cpu"))
    embed = model.transformer.wte.weight.numel() + model.lm_head.weight.numel()
    blocks = sum(p.numel() for p in model.transformer.h.parameters())
    expected = 4 * (2 * embed + blocks)
    assert rows[0]["optimizer_bytes"] == rows[1]["optimizer_bytes"] == expected
    assert float(cells["MidTrainer"][8]) == pytest.approx(expected / 2**20, abs=0.05)
