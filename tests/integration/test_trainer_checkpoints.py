"""A real Trainer with NanoChatOptimizerMixin in 2 gloo processes (`accelerate launch`, tiny Llama, global batch 4):
its checkpoint holds every rank's part of the optimizer and resumes on 1 and on 4 processes with the losses and
parameters of the uninterrupted 2-process run; clipping clips the averaged gradient, so 2 processes equal 1 where the
stock Trainer's clipping of each rank's local gradient does not."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from mp_launch import launch_command  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = str(Path(__file__).with_name("trainer_worker.py"))


def _run(out: Path, nproc: int, *flags: str):
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [*launch_command(nproc, WORKER), str(out), *flags]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text()), load_file(out / "params.safetensors")


def _worst(params, expected) -> float:
    return max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())


def test_two_processes_save_and_resume_on_one_and_four(tmp_path):
    clip = ("--clip", "0.01")  # below every step's gradient norm: every step clips
    full, expected = _run(tmp_path / "two", 2, "--save_steps", "2", *clip)
    checkpoint = tmp_path / "two" / "run" / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("optimizer.rank*")) == [
        "optimizer.rank0.safetensors",
        "optimizer.rank1.safetensors",
    ]
    for world in (1, 4):
        resumed, params = _run(tmp_path / f"on{world}", world, "--resume", str(checkpoint), *clip)
        assert resumed["world_size"] == world
        assert resumed["losses"] == pytest.approx(full["losses"], rel=1e-5), world  # the 2 saved, then 2 new
        worst = _worst(params, expected)
        print(f"resumed on {world}: worst relative parameter difference vs the uninterrupted 2 processes", worst)
        assert worst < 1e-5


def test_clipping_clips_the_averaged_gradient(tmp_path):
    clip = ("--clip", "0.01")
    _, one = _run(tmp_path / "one", 1, *clip)
    _, two = _run(tmp_path / "two", 2, *clip)
    _, local = _run(tmp_path / "local", 2, *clip, "--stock_clip")
    print("2 processes vs 1:", _worst(two, one), "| stock per-rank clipping vs 1:", _worst(local, one))
    assert _worst(two, one) < 1e-5
    assert _worst(local, one) > 1e-3  # each rank clipping its own pieces by its own norm: other numbers
