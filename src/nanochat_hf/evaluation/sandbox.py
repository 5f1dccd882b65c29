"""Run a generated Python program in a child process with limits, as HumanEval scoring needs: treat it as hostile.

The program runs in a fresh temporary directory (removed afterwards, whatever the program did) with a clean
environment (PATH, and HOME/TMPDIR pointing into the directory: no token or other secret of the evaluator's),
started by `sandbox_launch.py`, which uses what the OS offers (its docstring says how each works):
namespaces (network, PID, mount, IPC; plus a user namespace when not root), uid nobody when root, rlimits
(CPU, per-process address space = total memory / process count, file size, process count, no core files) and
process groups. `MECHANISMS` lists them; `sandbox_mechanisms()` says which hold on this machine, and docs/sandbox.md
has the table per platform. The launcher kills the program when its time is up; the evaluator keeps its own
deadline on the launcher and cleans the directory up in any case.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MECHANISMS = (
    "network namespace",
    "PID namespace",
    "read-only filesystem",
    "private /proc",
    "unprivileged uid",
    "process limit",
)
_LAUNCHER = str(Path(__file__).with_name("sandbox_launch.py"))
_GRACE_SECONDS = 10  # the evaluator's deadline on the launcher, past the program's own

# Runs in the child before the program: a friendly error for Python's socket API (the network namespace is what
# actually keeps it off the network), then the program.
_PRELUDE = """
import runpy, socket, sys
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the evaluation sandbox")
socket.socket = socket.create_connection = socket.getaddrinfo = socket.socketpair = socket.fromfd = _no_network
sys.argv = ["program.py"]
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass(frozen=True)
class RunResult:
    passed: bool
    reason: str  # "passed", "failed (exit N): last stderr line", "timeout after Ns"
    held: tuple[str, ...] = field(default=(), compare=False)  # the MECHANISMS that held for this run


def run_program(
    program: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 16, max_processes: int = 4
) -> RunResult:
    """Run `program` (Python source) in the sandbox; passed means it exited 0 within `timeout` seconds.

    `memory_mb` is for all its processes together: each of the at most `max_processes` gets an equal share
    (256 MB by default, nanochat's per-process limit)."""
    workdir = tempfile.mkdtemp(prefix="nanochat_hf_sandbox_")
    try:
        Path(workdir, "program.py").write_text(program, encoding="utf-8")
        cfg = {
            "workdir": os.path.realpath(workdir),
            "timeout": timeout,
            "cpu_seconds": int(timeout) + 1,
            "memory_bytes": (memory_mb << 20) // max_processes,
            "file_bytes": max_file_mb << 20,
            "max_processes": max_processes,
            "prelude": _PRELUDE,
            "env": {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": workdir,
                "TMPDIR": workdir,
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        }
        launcher = subprocess.Popen(
            [sys.executable, "-I", _LAUNCHER, json.dumps(cfg)],
            cwd=workdir,
            env={"PATH": cfg["env"]["PATH"]},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = launcher.communicate(timeout=timeout + _GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)  # the program dies with it (parent-death signal)
            launcher.communicate()
            return RunResult(False, f"timeout after {timeout:g}s")
        try:  # the launcher's last line; nothing (or a cut line) if it was killed
            report = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = None
        if report is None:  # the launcher itself failed
            lines = err.decode("utf-8", "replace").strip().splitlines() or [f"exit {launcher.returncode}"]
            return RunResult(False, f"sandbox failed: {lines[-1][:200]}")
        held = tuple(report["held"])
        if report["timed_out"]:
            return RunResult(False, f"timeout after {timeout:g}s", held)
        if report["returncode"] == 0:
            return RunResult(True, "passed", held)
        stderr = Path(workdir, "stderr.txt")
        text = stderr.read_bytes()[-4096:].decode("utf-8", "replace") if stderr.is_file() else ""
        text += err.decode("utf-8", "replace")  # the launcher's, if the program could not start
        lines = text.strip().splitlines()
        return RunResult(
            False, f"failed (exit {report['returncode']})" + (f": {lines[-1][:200]}" if lines else ""), held
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.cache
def sandbox_mechanisms() -> tuple[str, ...]:
    """Which of MECHANISMS hold on this machine (one trivial run, cached)."""
    return run_program("pass\n", timeout=30).held
