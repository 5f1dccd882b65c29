"""benchmarks/convergence.py runs end to end at a tiny size (2 arms, 4 steps) and prints its table."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_two_arms_print_the_table_and_write_the_curves(convergence, capsys, tmp_path):
    """Slow: both arms of the benchmark train for a few steps in this process (seconds); the benchmark's own table and
    curves are what is tested."""
    out = tmp_path / "curves.json"
    report = convergence.main(
        [
            "--depth",
            "1",
            "--steps",
            "4",
            "--eval_every",
            "2",
            "--lrs",
            "0.01",
            "--max_seq_len",
            "64",
            "--device_batch_size",
            "2",
            "--total_batch_size",
            "256",
            "--eval_tokens",
            "256",
            "--output",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert "final val bpb" in text and "steps to target" in text, text
    assert [line.split()[0] for line in text.splitlines()[-2:]] == ["muon", "adamw"], text
    saved = json.loads(out.read_text())  # the file holds the whole report, summary included
    assert saved["summary"] == report["summary"] and saved["summary"]["best_adamw"] == "adamw lr=0.01"
    muon, adamw = saved["arms"]
    assert [s for s, _ in muon["curve"]] == [s for s, _ in adamw["curve"]] == [0, 2, 4]
    assert muon["curve"][0] == adamw["curve"][0]  # same initial weights, same validation tokens
    assert muon["final_val_bpb"] != adamw["final_val_bpb"]  # different optimizers did train
    assert (muon["optimizer"], adamw["optimizer"], adamw["matrix_lr"]) == ("muon", "adamw", 0.01)
    assert adamw["steps_to_target"] is not None and adamw["ratio"] == 1.0
    assert not list(tmp_path.glob(".nanochat_hf-tmp-*"))  # written atomically, no temporary left


def test_steps_to_target_and_ratio(convergence):
    arms = [
        {"name": "muon", "optimizer": "muon", "final_val_bpb": 0.8, "curve": [(0, 3.0), (10, 1.0), (20, 0.8)]},
        {"name": "a1", "optimizer": "adamw", "final_val_bpb": 1.0, "curve": [(0, 3.0), (10, 1.5), (20, 1.0)]},
        {"name": "a2", "optimizer": "adamw", "final_val_bpb": 1.2, "curve": [(0, 3.0), (10, 1.3), (20, 1.2)]},
    ]
    summary = convergence.summarize(arms)
    assert summary == {"best_adamw": "a1", "target_val_bpb": 1.0, "best_adamw_steps": 20}
    assert [(a["steps_to_target"], a["ratio"]) for a in arms] == [(10, 0.5), (20, 1.0), (None, None)]
    assert "not reached" in convergence.table(arms, summary).splitlines()[-1]


def test_bad_lrs_is_one_clear_error(convergence, capsys):
    with pytest.raises(SystemExit):
        convergence.main(["--lrs", "0.01,fast"])
    assert "--lrs '0.01,fast': expected a comma list of numbers" in capsys.readouterr().err


@pytest.mark.slow
def test_llama_mode_runs_every_arm_and_times_the_steps(convergence, capsys):
    report = convergence.main(["--model", "llama", "--steps", "2", "--eval_every", "1", "--lrs", "0.003"])
    text = capsys.readouterr().out
    assert [a["name"] for a in report["arms"]] == ["muon 2025-12", "muon 2026-07", "adamw lr=0.003"]
    assert "(roles routing)" in text and "adamw/tied_embedding" in text  # a SmolLM2 shape: tied embeddings
    curves = [a["curve"] for a in report["arms"]]
    assert all([s for s, _ in c] == [0, 1, 2] for c in curves) and len({c[0] for c in curves}) == 1
    assert len({c[-1][1] for c in curves}) == 3  # every arm trained, differently
    assert set(report["step_seconds"]) == {"nanochat 2025-12", "nanochat 2026-07", "torch Muon + AdamW"}
    assert "torch Muon + AdamW" in text.splitlines()[-2] and text.splitlines()[-1].startswith("load (uptime):")


@pytest.mark.slow
def test_fused_model_split_arms_and_train_loss(convergence, capsys):
    """--model phi3 --split: each recipe whole and split (the routing table shows the split groups), the split line
    of steps to the whole arm's final val bpb, and each arm's train loss."""
    report = convergence.main(["--model", "phi3", "--split", "--steps", "2", "--eval_every", "1", "--lrs", "0.003"])
    text = capsys.readouterr().out
    names = ["muon 2025-12", "muon 2026-07", "muon 2025-12 split", "muon 2026-07 split", "adamw lr=0.003"]
    assert [a["name"] for a in report["arms"]] == names
    assert "muon/320x192/split320:192+64+64" in text and "muon/1024x192/split1024:512+512" in text
    assert set(report["summary"]["split"]) == {"2025-12", "2026-07"}
    assert "split_fused, recipe 2026-07: steps to" in text
    assert all(a["final_train_loss"] > 0 for a in report["arms"])
    assert report["arms"][0]["final_val_bpb"] != report["arms"][2]["final_val_bpb"]  # splitting changed the run
