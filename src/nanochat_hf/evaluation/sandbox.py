"""Run a generated Python program in a child process with limits, as HumanEval scoring needs.

The child runs in a fresh temporary working directory (removed afterwards, whatever the program did), with
HOME/TMPDIR pointing into it, a CPU-time and address-space limit (`resource`), a cap on the size of any file it
writes, sockets disabled before the program starts, and its own process group, which is killed outright when
the wall-clock limit passes. This keeps a looping, memory-hungry or file-writing completion from hurting the
evaluation; it is not a security boundary against code written to escape (nothing short of a container is).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs in the child before the program: no network (every way to get a socket raises), then the program.
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


def _limits(cpu_seconds: int, memory_bytes: int, file_bytes: int):
    def apply() -> None:  # in the child, between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(program: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 16) -> RunResult:
    """Run `program` (Python source) in a sandboxed child; passed means it exited 0 within `timeout` seconds."""
    workdir = tempfile.mkdtemp(prefix="nanochat_hf_sandbox_")
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": workdir, "TMPDIR": workdir, "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([sys.executable, "-I", "-c", _PRELUDE], cwd=workdir, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True,  # own process group: children it spawns die with it
                                preexec_fn=_limits(int(timeout) + 1, memory_mb << 20, max_file_mb << 20))
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return RunResult(False, f"timeout after {timeout:g}s")
        finally:
            try:  # anything it left running in its group goes too
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if proc.returncode == 0:
            return RunResult(True, "passed")
        lines = stderr.decode("utf-8", "replace").strip().splitlines()
        return RunResult(False, f"failed (exit {proc.returncode})" + (f": {lines[-1][:200]}" if lines else ""))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
