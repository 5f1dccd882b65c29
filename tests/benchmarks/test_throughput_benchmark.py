"""benchmarks/throughput.py at a tiny shape: both loops run (in this process, eager) and the table has every column."""

from __future__ import annotations

import pytest
import torch

COLUMNS = [
    "loop",
    "compile",
    "processes",
    "runs",
    "tok/s",
    "tok/s min-max",
    "/ base",
    "/ base min-max",
    "compile s",
    "peak MiB/rank",
    "/ base",
    "opt MiB/rank",
    "MFU",
]


@pytest.mark.slow
def test_table_prints_every_column(throughput, tmp_path, capsys):
    """Slow: each arm trains a few steps, as the benchmark does."""
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
        assert len(row) == len(COLUMNS) and row[1:4] == ["eager", "1", "1"], row
        assert float(row[4].replace(",", "")) > 0 and float(row[9].replace(",", "")) > 100  # tok/s, RSS MiB
        assert row[5] == f"{row[4]}-{row[4]}"  # one run: its tok/s is the slowest and the fastest
        assert row[8] == "n/a" and row[12].endswith("%") and float(row[12][:-1]) > 0  # compile s, MFU
    assert cells["nanochat loop"][6] == cells["nanochat loop"][10] == "1.00"
    assert cells["nanochat loop"][7] == "1.00-1.00"
    # optimizer state: AdamW's two fp32 moments of wte and lm_head, Muon's fp32 momentum of every block matrix
    model = throughput.build_model(throughput.parse(argv), torch.device("cpu"))
    embed = model.transformer.wte.weight.numel() + model.lm_head.weight.numel()
    blocks = sum(p.numel() for p in model.transformer.h.parameters())
    expected = 4 * (2 * embed + blocks)
    assert rows[0]["optimizer_bytes"] == rows[1]["optimizer_bytes"] == expected
    assert float(cells["MidTrainer"][11]) == pytest.approx(expected / 2**20, abs=0.05)


def test_ratio_pairs_the_runs_of_one_round(throughput):
    """The median step time gives tok/s; "/ base" is the median of the ratios of runs made in the same round
    (round 2 was slow for both loops: paired, it is a ratio of 2.0 / 1.9, not of a fast run to a slow one)."""
    steps = {"baseline": [1.0, 2.0, 1.5], "midtrainer": [1.1, 1.9, 1.5]}
    runs = [
        {
            "loop": loop,
            "compiled": False,
            "processes": 2,
            "steady_step_s": steps[loop][i],
            "warmup_s": 3.0,
            "peak_bytes": 2**30,
            "optimizer_bytes": 2**20,
            "tokens_per_step": 4096,
            "tok_s": 4096 / steps[loop][i],
            "flops_per_token": 1.0,
            "peak_flops": None,
        }
        for i in range(3)
        for loop in steps
    ]
    base, mid = throughput.summarize(runs)
    assert base["tok_s"] == mid["tok_s"] == 4096 / 1.5 and mid["runs"] == 3
    assert mid["tok_s_range"] == (4096 / 1.9, 4096 / 1.1)
    assert mid["ratios"] == pytest.approx([1.0 / 1.1, 2.0 / 1.9, 1.0])
    assert base["ratios"] == [1.0, 1.0, 1.0]
