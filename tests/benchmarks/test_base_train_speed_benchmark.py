"""benchmarks/base_train_speed.py: the table and its per-round ratios, the one line without nanochat, and a tiny run
of our base_train (HEAD left out: the suite never needs a nanochat checkout)."""

from __future__ import annotations

import pytest


def test_ratio_pairs_the_runs_of_one_round(base_train_speed, capsys):
    """ours / HEAD is the median of each round's ratio (round 2 was slow for both: 900 / 1000, not 900 / 2000); both
    W = 2 rows are set against HEAD's W = 2 runs; tok/s is the median over the rounds."""
    head1 = [{"tok_s": t, "printed_tok_s": t + 1} for t in (2000.0, 1000.0, 1500.0)]
    ours1 = [{"tok_s": t, "printed_tok_s": t + 1} for t in (2100.0, 900.0, 1500.0)]
    head2 = [{"tok_s": 3000.0, "printed_tok_s": 3000.0}] * 3
    zero2 = [{"tok_s": t, "printed_tok_s": t} for t in (2850.0, 3000.0, 3150.0)]
    fsdp2 = [{"tok_s": 1500.0, "printed_tok_s": 1500.0}] * 3
    results = {("head", "w1"): head1, ("ours", "w1"): ours1, ("head", "w2"): head2}
    results |= {("ours", "w2"): zero2, ("ours", "fsdp2"): fsdp2}
    table = base_train_speed.summarize(results, ["w1", "w2", "fsdp2"], with_head=True)
    assert table == [
        ["W=1", "HEAD base_train.py", "1,500", "1,501", "1.000", ""],
        ["W=1", "ours base_train.py", "1,500", "1,501", "1.000", "0.900-1.050"],
        ["W=2", "HEAD base_train.py", "3,000", "3,000", "1.000", ""],
        ["W=2 ZeRO-2 (default)", "ours base_train.py", "3,000", "3,000", "1.000", "0.950-1.050"],
        ["W=2 FSDP2", "ours base_train.py", "1,500", "1,500", "0.500", "0.500-0.500"],
    ]
    args = base_train_speed.parse(["--repeats", "3"])
    base_train_speed.print_table(table, args)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| processes | loop | tok/s | tok/s as printed | / HEAD (median of 3) | / HEAD min-max |"
    assert lines[-1] == "| W=2 FSDP2 | ours base_train.py | 1,500 | 1,500 | 0.500 | 0.500-0.500 |"


def test_without_nanochat_it_says_so_in_one_line(base_train_speed, tmp_path):
    assert base_train_speed.head_missing(tmp_path) == (
        f"no nanochat checkout at {tmp_path} (--nanochat DIR or $NANOCHAT_DIR): HEAD not measured"
    )


def test_bad_rows_are_refused_in_one_line(base_train_speed):
    with pytest.raises(SystemExit) as e:
        base_train_speed.main(["--rows", "w1,w3"])
    assert e.value.code == "base_train_speed: error: --rows 'w1,w3': expected some of w1,w2,fsdp2"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tiny_run_prints_its_table(base_train_speed, tmp_path, capsys):
    """Our scripts/base_train.py in a fresh process (HEAD absent): step lines are timed, the table has our row."""
    tiny = "--rows w1 --repeats 1 --steps 5 --warmup 1 --depth 1 --max_seq_len 64 --device_batch_size 2"
    base_train_speed.main(["--nanochat", str(tmp_path), *tiny.split(), "--vocab_size", "300", "--docs_per_shard", "60"])
    out = capsys.readouterr().out
    assert f"base_train_speed: no nanochat checkout at {tmp_path}" in out
    row = next(line for line in out.splitlines() if line.startswith("| W=1 | ours"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[2].replace(",", "")) > 0 and float(cells[3].replace(",", "")) > 0 and cells[4] == "n/a"
    assert "HEAD base_train.py" not in out
