"""Runs mid_train (through mp_worker.py) in fresh processes, for the tests that compare 1 and 2 processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

MP_WORKER = str(Path(__file__).with_name("mp_worker.py"))  # mid_train, writing each rank's final parameters


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_mid_train(
    args: list[str], cwd: Path, nproc: int, timeout: int, env: dict | None = None
) -> subprocess.CompletedProcess:
    """mid_train with `args` in one process, or in `nproc` gloo processes under `accelerate launch` (its --cpu
    launcher needs MPI for several processes; --multi_gpu on a CPU machine uses gloo); asserts that it exits 0."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    cmd = [sys.executable, MP_WORKER]
    if nproc > 1:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), MP_WORKER]  # fmt: skip
    proc = subprocess.run(
        [*cmd, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
