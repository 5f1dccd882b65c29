"""Runs mid_train (through mp_worker.py) in fresh processes, for the tests that compare 1 and 2 processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil  # accelerate's dependency

MP_WORKER = str(Path(__file__).with_name("mp_worker.py"))  # mid_train, writing each rank's final parameters

# The tiny run the multi-process test files share (each adds its model, steps and saves): no spelling eval, no chat
# eval, eager, and one thread in every layout (the same kernels in 1 and 2 processes, for bitwise-comparable math).
MP_ARGS = [
    "--max_seq_len",
    "64",
    "--device_batch_size",
    "2",
    "--total_batch_size",
    "256",
    "--eval_tokens",
    "512",
    "--spelling_eval_rows",
    "0",
    "--disable_tqdm",
    "true",
    "--num_threads",
    "1",
    "--chat_eval_tasks",
    "",
    "--torch_compile",
    "false",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(nproc: int, script: str = MP_WORKER) -> list[str]:
    """`python script` for one process; for several, `accelerate launch` of `nproc` gloo processes on a free port
    (its --cpu launcher needs MPI for several processes; --multi_gpu on a CPU machine uses gloo)."""
    if nproc == 1:
        return [sys.executable, script]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port()), script]  # fmt: skip


def launch_mid_train(
    args: list[str], cwd: Path, nproc: int, timeout: int, env: dict | None = None
) -> subprocess.CompletedProcess:
    """mp_worker.py (mid_train) with `args` in `nproc` processes (launch_command); asserts that it exits 0."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run(
        [*launch_command(nproc), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def launch_worker(worker: str, out: Path, nproc: int, *flags: str) -> Path:
    """`worker out flags...` in `nproc` processes (launch_command), `out` created first; asserts that it exits 0."""
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [*launch_command(nproc, worker), str(out), *flags], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


# The length of a run to preempt (`preempt`): it stops some steps after step 5, and long before step 60, on any
# machine.
PREEMPT_STEPS = "60"


def preempt(proc: subprocess.Popen) -> None:
    """Once `proc` (a mid_train run, its stdout a pipe) logs step 5: SIGTERM it (a launcher passes the signal on to
    its processes, as a cluster preempting a job does), then for 5 s let it and every process it started run a tenth
    of the time (SIGSTOP 0.45 s, SIGCONT 0.05 s). transformers acts on the signal 3 s after it arrives, during which
    the run gets 0.3 s of CPU: a few steps on any machine, where at full speed a fast one ran hundreds."""
    for line in proc.stdout:
        if line.startswith("step 00005/"):
            break
    proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 5
    while time.monotonic() < end and proc.poll() is None:
        try:
            root = psutil.Process(proc.pid)
            group = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:  # it has ended meanwhile
            break
        try:
            for p in group:
                p.suspend()
            time.sleep(0.45)
        except psutil.NoSuchProcess:
            pass
        finally:
            for p in group:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.resume()
        time.sleep(0.05)


def assert_preempted(command: list[str], cwd: Path, out: Path, timeout: int) -> None:
    """Run a 2-process mid_train `command` writing to `out`, `preempt` it, and check what a preempted run leaves:
    one line saying at which step it stopped, a non-zero exit, that step's checkpoint with both ranks' optimizer
    files, no final model."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    preempt(proc)
    _, stderr = proc.communicate(timeout=timeout)
    ours = [line for line in stderr.splitlines() if line.startswith("mid_train: preempted (SIGTERM) at step ")]
    assert proc.returncode != 0 and len(ours) == 1, stderr[-3000:]
    step = int(ours[0].split(" at step ")[1].split(" ")[0])
    (checkpoint,) = out.glob("checkpoint-*")
    assert checkpoint.name == f"checkpoint-{step}" and (checkpoint / "trainer_state.json").is_file()
    assert sorted(p.name for p in checkpoint.glob("optimizer.rank*")) == [
        "optimizer.rank0.safetensors",
        "optimizer.rank1.safetensors",
    ]
    assert not (out / "model.safetensors").exists()
