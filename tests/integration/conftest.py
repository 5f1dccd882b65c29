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


# The multi-process runs of test_trainer_distributed.py, test_trainer_checkpoints.py, test_fsdp_trainer.py and
# test_fsdp_trl.py, shared: one launch per world size (runs_worker.py; a launch costs seconds of imports, a run a
# fraction of one), each run in <launch folder>/<name>. CLIP: below every step's gradient norm (every step clips).
CLIP = ["--clip", "0.01"]
TRL_KINDS = ("sft", "dpo", "grpo")
REFUSALS = ("fsdp1", "shard1", "hsdp")  # test_fsdp_trainer.py's refused shardings


def launch_runs(out: Path, nproc: int, *runs: list[str]) -> Path:
    """runs_worker.py's ``runs`` ([name, worker, args...]) one after another in one launch of ``nproc`` processes;
    asserts that it exits 0 and returns ``out``."""
    if (training := str(Path(_HERE).parent / "training")) not in sys.path:
        sys.path.insert(0, training)
    from mp_launch import _free_port, launch_command

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = [[str(_free_port()) if a == "PORT" else a for a in run] for run in runs]
    command = [*launch_command(nproc, str(Path(_HERE) / "runs_worker.py")), str(out), *map(json.dumps, runs)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def one_process_runs(tmp_path_factory):
    """One plain process: trainer_worker's `one` (clip 1.0) and `one_clip` (CLIP); fsdp_trainer_worker's `single`
    (clip 0.1); fsdp_trl_worker's single_<kind>; then, in a gloo group of one process, the refusals of
    fsdp_trainer_worker (fsdp1, shard1, hsdp) and of GRPO's continuous batching under FSDP2 (`cb`)."""
    return launch_runs(
        tmp_path_factory.mktemp("runs") / "one", 1,
        ["one", "trainer"], ["one_clip", "trainer", *CLIP], ["single", "fsdp_trainer", "train"],
        *([f"single_{kind}", "fsdp_trl", kind] for kind in TRL_KINDS),
        *([mode, "fsdp_trainer", mode, "PORT"] for mode in REFUSALS),
        ["cb", "fsdp_trl", "grpo", "--fsdp", "--cb", "PORT"],
    )  # fmt: skip


@pytest.fixture(scope="session")
def two_process_runs(one_process_runs):
    """2 gloo processes: trainer_worker's `two` (clip 1.0), `hooked` (DDP keeps its own hook), `clip` (CLIP, a
    checkpoint at step 2) and `local` (CLIP by the stock Trainer's per-rank clipping); fsdp_trainer_worker's `fsdp`
    (FSDP2, 2 micro-batches per process); fsdp_trl_worker's fsdp_<kind> and `resumed` (single_sft's checkpoint at
    step 2, resumed under FSDP2)."""
    checkpoint = str(one_process_runs / "single_sft" / "run" / "checkpoint-2")
    return launch_runs(
        one_process_runs.parent / "two", 2,
        ["two", "trainer"], ["hooked", "trainer", "--ddp_hook"], ["clip", "trainer", *CLIP, "--save_steps", "2"],
        ["local", "trainer", *CLIP, "--stock_clip"], ["fsdp", "fsdp_trainer", "train", "--fsdp", "--accumulation", "2"],
        *([f"fsdp_{kind}", "fsdp_trl", kind, "--fsdp"] for kind in TRL_KINDS),
        ["resumed", "fsdp_trl", "sft", "--fsdp", "--resume", checkpoint],
    )  # fmt: skip


@pytest.fixture(scope="session")
def resumed_runs(two_process_runs):
    """trainer_worker's `clip` checkpoint at step 2 resumed on 1 process (`on1`) and on 4 (`on4`)."""
    checkpoint = str(two_process_runs / "clip" / "run" / "checkpoint-2")
    for world in (1, 4):
        launch_runs(
            two_process_runs.parent / "resumed", world, [f"on{world}", "trainer", *CLIP, "--resume", checkpoint]
        )
    return two_process_runs.parent / "resumed"
