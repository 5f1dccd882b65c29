"""HumanEval scoring runs model code: passing, failing, looping, file-writing ones, and the hostile completions of
issue 23 (each escape tried by a program; a test skips, saying why, where this OS refuses the mechanism it needs)."""

import os
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from nanochat_hf.evaluation import load_problems, run_program, sandbox
from nanochat_hf.evaluation.sandbox import MECHANISMS, sandbox_mechanisms
from nanochat_hf.tasks import EVAL_TASKS
from nanochat_hf.tasks.humaneval import check as check_humaneval
from nanochat_hf.tasks.humaneval import program as humaneval_program

SANDBOX_FILE = Path(sandbox.__file__)


@pytest.fixture
def problem(data_files):
    (p,) = load_problems(EVAL_TASKS["HumanEval"], data_files["HumanEval"])
    return p


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The sandbox's temporary directories go here, so the test can see what is left behind."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def needs(*mechanisms: str) -> None:
    missing = [m for m in mechanisms if m not in sandbox_mechanisms()]
    if missing:
        pytest.skip(f"this OS refuses the sandbox's {', '.join(missing)} (held: {', '.join(sandbox_mechanisms())})")


def _processes_with(marker: str) -> list[str]:
    """Host pids whose command line holds `marker` (zombies, which have exited, excluded)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (
                marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
            ):
                found.append(pid)
        except OSError:
            pass
    return found


def test_completions_that_pass(problem, scratch):
    assert check_humaneval(problem, "    return a + b\n")  # the body, as HumanEval's canonical solution
    full = "Here it is:\n```python\ndef add(a, b):\n    return math.fsum([a, b])\n```\n"
    assert "import math" in humaneval_program(problem, full)  # the prompt's imports come along
    assert check_humaneval(problem, full)
    assert list(scratch.iterdir()) == []


def test_wrong_completion_fails_with_the_reason(problem, scratch):
    result = run_program(humaneval_program(problem, "    return a - b\n"))
    assert not result.passed and result.reason.startswith("failed (exit 1): AssertionError")
    assert set(result.held) <= set(MECHANISMS)


@pytest.mark.slow
def test_endless_loop_is_killed_and_scored_zero(problem, scratch):
    result = run_program(humaneval_program(problem, "    while True:\n        pass\n"), timeout=2.0)
    assert (result.passed, result.reason) == (False, "timeout after 2s")
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_file_writing_completion_is_killed_and_leaves_nothing(problem, scratch):
    # writes into its cwd, $HOME and $TMPDIR, leaves a child process (in its process group) and loops
    marker = f"sandbox-child-{uuid.uuid4().hex}"
    body = (
        "    import os, subprocess, sys, tempfile\n"
        "    for d in ('.', os.environ['HOME'], tempfile.gettempdir()):\n"
        "        open(os.path.join(d, 'junk.txt'), 'w').write('x' * 1000)\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}],\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "    while True:\n        pass\n"
    )
    before = set(os.listdir(os.getcwd()))
    result = run_program(humaneval_program(problem, body), timeout=3.0)
    assert (result.passed, result.reason) == (False, "timeout after 3s")
    assert list(scratch.iterdir()) == []  # the working directory (its HOME and TMPDIR) is gone
    assert set(os.listdir(os.getcwd())) == before
    assert _processes_with(marker) == []  # the child died with the program


def test_network_and_big_files_are_refused(scratch):
    assert run_program("import socket\nsocket.create_connection(('127.0.0.1', 80))\n").reason.endswith(
        "OSError: network access is disabled in the evaluation sandbox"
    )
    assert not run_program("open('big', 'wb').write(b'x' * (64 << 20))\n", max_file_mb=1).passed
    assert not run_program("x = bytearray(4 << 30)\n", memory_mb=512).passed
    assert list(scratch.iterdir()) == []


# --- issue 23: hostile completions -----------------------------------------------------------------------------


def test_no_secret_in_the_environment(scratch, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_evaluator")
    program = "import os, sys\nsys.exit('HF_TOKEN' in os.environ or 'hf_secret' in repr(os.environ))\n"
    assert run_program(program).passed


def test_cannot_write_outside_its_directory(scratch):
    needs("read-only filesystem")
    target = Path(tempfile.mkdtemp(prefix="sandbox_target_", dir=tempfile.gettempdir()))  # as /tmp: anyone writes
    try:
        target.chmod(0o777)
        for path in (target / "x", Path("/tmp") / f"sandbox-{uuid.uuid4().hex}", Path.home() / "sandbox-probe"):
            result = run_program(f"open({str(path)!r}, 'w').write('x')\n")
            assert not result.passed and not path.exists(), (path, result)
    finally:
        for p in target.iterdir():
            p.unlink()
        target.rmdir()
    assert list(scratch.iterdir()) == []


def test_cannot_signal_its_parent_or_the_evaluator(scratch):
    needs("PID namespace")
    # the evaluator (this test's process) must survive, and every kind of signal attempt must be refused
    program = (
        "import os, signal\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "try:\n"
        f"    os.kill({os.getpid()}, 0)\n"
        "except (ProcessLookupError, PermissionError):\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('the evaluator can be signalled')\n"
    )
    result = run_program(program)
    assert "the evaluator can be signalled" not in result.reason
    assert list(scratch.iterdir()) == []  # and it cleaned up


def test_cannot_read_the_evaluators_environment(scratch):
    needs("private /proc")
    program = (
        "import os\n"
        f"for pid in (os.getppid(), {os.getpid()}):\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    raise SystemExit(f'read the environment of {pid}: {len(data)} bytes')\n"
    )
    assert run_program(program).passed


@pytest.mark.slow
def test_setsid_child_is_gone_when_time_is_up(scratch):
    """Slow: the program must outlive the sandbox's time limit (seconds of wall time) for the kill to be seen."""
    needs("PID namespace")
    marker = f"sandbox-setsid-{uuid.uuid4().hex}"
    program = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}],\n"
        "                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "import time; time.sleep(600)\n"
    )
    assert run_program(program, timeout=3.0).reason == "timeout after 3s"
    assert _processes_with(marker) == []
    # and a program that exits at once, leaving the setsid child behind, takes it along too
    assert run_program(program.replace("import time; time.sleep(600)\n", "")).passed
    assert _processes_with(marker) == []


def test_no_network_even_past_the_socket_module(scratch):
    needs("network namespace")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.5)
    tries = [
        f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\n",
        f"import importlib, socket\nimportlib.reload(socket)\nsocket.create_connection(('127.0.0.1', {port}))\n",
        (
            "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import socket; socket.create_connection("
            f'("127.0.0.1", {port}))\'], check=True)\n'
        ),
    ]
    try:
        for program in tries:
            assert not run_program(program).passed, program
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_memory_limit_is_for_all_processes_together(scratch):
    needs("process limit")
    # each process grabs what it can in 8 MB pieces; the parent adds up what its children held
    program = (
        "import os\n"
        "def grab():\n"
        "    held = []\n"
        "    try:\n"
        "        while True:\n"
        "            held.append(bytearray(8 << 20))\n"
        "    except MemoryError:\n"
        "        return len(held) * 8\n"
        "pipes = []\n"
        "for _ in range(16):\n"
        "    r, w = os.pipe()\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.write(w, str(grab()).encode()); os._exit(0)\n"
        "    os.close(w); pipes.append(r)\n"
        "total = grab() + sum(int(os.read(r, 64) or 0) for r in pipes)\n"
        "raise SystemExit(f'total {total} MB in {len(pipes) + 1} processes')\n"
    )
    result = run_program(program, memory_mb=256, timeout=20)
    total, processes = (int(w) for w in result.reason.split("total ")[1].split()[::3][:2])
    assert processes <= 4 and 0 < total <= 256, result.reason


def test_process_count_is_limited(scratch):
    needs("process limit")
    program = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "raise SystemExit(f'forked {n}')\n"
    )
    result = run_program(program, max_processes=4, timeout=10)
    assert result.reason.endswith(("forked 3", "forked 2", "forked 1", "forked 0")), result.reason


def test_runs_for_an_evaluator_whose_python_only_root_can_reach(tmp_path):
    """A checkout in a folder only root can enter (`mktemp -d` is 0700): the unprivileged uid cannot reach its
    venv's python, so the program runs on the base installation's interpreter, which the sandbox exposes."""
    needs("unprivileged uid")
    venv = tmp_path / "private" / "venv"  # tmp_path is 0700 root's
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    load = (  # the sandbox module is standard library only: loaded by path, without the package's dependencies
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sandbox', {str(SANDBOX_FILE)!r})\n"
        "sandbox = sys.modules['sandbox'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sandbox)\n"
        "result = sandbox.run_program('import os; print(os.getuid()); raise SystemExit(3)')\n"
        "print(result.reason, 'unprivileged uid' in result.held)\n"
    )
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", load], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "failed (exit 3) True", proc.stderr  # it ran: the exit code is the program's
