"""--optimizer_recipe 2026-07 trains, its checkpoints refuse a resume with the other recipe, and
--nanochat_optimizer warm-starts from nanochat's optimizer files (checked before training, in one line)."""

import json

import pytest
import torch

from nanochat_hf.integration.optimizer_state import read_optimizer_checkpoint
from nanochat_hf.training.run import main

pytestmark = pytest.mark.slow


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("mid_train: error:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


def test_head_recipe_run_resume_and_warm_start(tmp_path, tiny_args, capsys):
    from nanochat_hf import NanoChatGPTForCausalLM
    from nanochat_hf.conversion import to_nanochat
    from nanochat_hf.conversion.optimizer_files import read_nanochat_optimizer

    out = tmp_path / "run"
    metrics = main(
        [
            *tiny_args,
            "--num_iterations",
            "2",
            "--save_steps",
            "2",
            "--spelling_eval_rows",
            "0",
            "--optimizer_recipe",
            "2026-07",
            "--output_dir",
            str(out),
        ]
    )
    assert metrics["steps"] == 2 and metrics["val_bpb"] > 0
    ckpt = out / "checkpoint-2"
    assert json.loads((ckpt / "run_fingerprint.json").read_text())["optimizer_recipe"] == "2026-07"
    state = read_optimizer_checkpoint(ckpt)
    assert state.recipe == "2026-07" and any("second_momentum_buffer" in st for st in state.full.values())  # NorMuon

    # the same run resumed with the December recipe: refused before training, nothing changed
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(SystemExit):
        main(
            [
                *tiny_args,
                "--num_iterations",
                "2",
                "--save_steps",
                "2",
                "--spelling_eval_rows",
                "0",
                "--output_dir",
                str(out),
                "--resume_from_checkpoint",
                "true",
            ]
        )
    line = _error_line(capsys)
    assert "optimizer_recipe was '2026-07' in the checkpoint and is '2025-12' now" in line, line
    assert sorted(p.name for p in out.rglob("*")) == before

    # to-nanochat of the checkpoint writes its optimizer as nanochat's HEAD-format file, which holds the same state
    nanochat_dir = tmp_path / "nanochat" / "chatsft_checkpoints" / "d2"  # nanochat's layout: the tokenizer beside
    to_nanochat(ckpt, nanochat_dir)
    path = nanochat_dir / "optim_000002_rank0.pt"
    assert sorted(p.name for p in nanochat_dir.glob("optim_*")) == [path.name]
    model = NanoChatGPTForCausalLM.from_pretrained(ckpt)
    written, world, fmt = read_nanochat_optimizer(path, model)
    ours = state.whole_state()
    assert (world, fmt) == (1, "head") and written.keys() == ours.keys()
    assert all(torch.equal(written[n][k], ours[n][k]) for n in ours for k in ours[n] if k != "step")
    # then a fresh run warm-started from it
    warm = main(
        [
            *tiny_args,
            "--num_iterations",
            "1",
            "--spelling_eval_rows",
            "0",
            "--optimizer_recipe",
            "2026-07",
            "--model_source",
            str(ckpt),
            "--nanochat_optimizer",
            str(path),
            "--output_dir",
            str(tmp_path / "w"),
        ]
    )
    assert warm["steps"] == 1
    assert f"optimizer warm-started from {path} (head format" in capsys.readouterr().out

    # a file set of another model is refused before training, in one line naming the file
    other = tmp_path / "other"
    with pytest.raises(SystemExit):
        main(
            [
                *tiny_args,
                "--demo_depth",
                "1",
                "--num_iterations",
                "1",
                "--optimizer_recipe",
                "2026-07",
                "--nanochat_optimizer",
                str(path),
                "--output_dir",
                str(other),
            ]
        )
    assert str(path) in _error_line(capsys)
    assert not other.exists() or not any(other.iterdir())


def test_unknown_recipe_is_one_line(tmp_path, tiny_args, capsys):
    with pytest.raises(SystemExit):
        main([*tiny_args, "--optimizer_recipe", "2026-13", "--output_dir", str(tmp_path / "x")])
    assert "optimizer_recipe=2026-13: expected one of 2025-12, 2026-07" in _error_line(capsys)
