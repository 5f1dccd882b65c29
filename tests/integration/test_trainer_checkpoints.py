"""A real Trainer with NanoChatOptimizerMixin in 2 gloo processes (`accelerate launch`, tiny Llama, global batch 4):
its checkpoint holds every rank's part of the optimizer and resumes on 1 and on 4 processes with the losses and
parameters of the uninterrupted 2-process run; clipping clips the averaged gradient, so 2 processes equal 1 where the
stock Trainer's clipping of each rank's local gradient does not."""

import json

import pytest
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _load(run):
    return json.loads((run / "rank0.json").read_text()), load_file(run / "params.safetensors")


def _worst(params, expected) -> float:
    return max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())


def test_two_processes_save_and_resume_on_one_and_four(two_process_runs, resumed_runs):
    """conftest's 2-process run clipping every step (`clip`, CLIP) saved at step 2, resumed there on 1 process
    (`on1`) and on 4 (`on4`)."""
    full, expected = _load(two_process_runs / "clip")
    checkpoint = two_process_runs / "clip" / "run" / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("optimizer.rank*")) == [
        "optimizer.rank0.safetensors",
        "optimizer.rank1.safetensors",
    ]
    for world in (1, 4):
        resumed, params = _load(resumed_runs / f"on{world}")
        assert resumed["world_size"] == world
        assert resumed["losses"] == pytest.approx(full["losses"], rel=1e-5), world  # the 2 saved, then 2 new
        worst = _worst(params, expected)
        print(f"resumed on {world}: worst relative parameter difference vs the uninterrupted 2 processes", worst)
        assert worst < 1e-5


def test_clipping_clips_the_averaged_gradient(one_process_runs, two_process_runs):
    """CLIP in 1 process (`one_clip`), 2 (`clip`, which also saved a checkpoint) and 2 clipping per rank (`local`)."""
    _, one = _load(one_process_runs / "one_clip")
    (_, two), (_, local) = (_load(two_process_runs / name) for name in ("clip", "local"))
    print("2 processes vs 1:", _worst(two, one), "| stock per-rank clipping vs 1:", _worst(local, one))
    assert _worst(two, one) < 1e-5
    assert _worst(local, one) > 1e-3  # each rank clipping its own pieces by its own norm: other numbers
