import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)


def _worker_module(name: str):
    """A module of tests/integration, importable by name so that spawned processes find its functions."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    return __import__(name)


@pytest.fixture(scope="session")
def state_worker():
    return _worker_module("state_worker")


@pytest.fixture(scope="session")
def save_worker():
    return _worker_module("save_worker")


# trainer_worker.py's runs, shared by test_trainer_distributed.py and test_trainer_checkpoints.py: one launch per
# world size (a launch costs seconds of imports, a run a fraction of one). CLIP: below every step's gradient norm.
CLIP = ["--clip", "0.01"]


def launch_trainer(out: Path, nproc: int, *runs: list[str]) -> str:
    """trainer_worker.py's ``runs`` ([name, flags...]) one after another in one launch of ``nproc`` processes, in
    out/<name>; asserts that it exits 0 and returns its stdout."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from mp_launch import launch_command

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [*launch_command(nproc, str(Path(_HERE) / "trainer_worker.py")), str(out), *map(json.dumps, runs)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="session")
def trainer_runs(tmp_path_factory):
    """The folder of every 2-process run: two (clip 1.0), hooked (DDP keeps its own hook), clip (CLIP, a checkpoint
    at step 2) and local (CLIP by the stock Trainer's per-rank clipping)."""
    root = tmp_path_factory.mktemp("trainer")
    launch_trainer(root, 2, ["two"], ["hooked", "--ddp_hook"], ["clip", *CLIP, "--save_steps", "2"],
                   ["local", *CLIP, "--stock_clip"])  # fmt: skip
    return root


@pytest.fixture(scope="session")
def trainer_one_runs(trainer_runs):
    """The 1-process runs, in the same folder: one (clip 1.0), one_clip (CLIP) and on1 (clip's checkpoint resumed)."""
    checkpoint = str(trainer_runs / "clip" / "run" / "checkpoint-2")
    launch_trainer(trainer_runs, 1, ["one"], ["one_clip", *CLIP], ["on1", *CLIP, "--resume", checkpoint])
    return trainer_runs


@pytest.fixture(scope="session")
def trainer_four_runs(trainer_runs):
    """on4: the 2-process run `clip`'s checkpoint resumed on 4 processes, in the same folder."""
    checkpoint = str(trainer_runs / "clip" / "run" / "checkpoint-2")
    launch_trainer(trainer_runs, 4, ["on4", *CLIP, "--resume", checkpoint])
    return trainer_runs
