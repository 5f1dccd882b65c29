"""HumanEval scoring runs model code: a passing, a failing, a looping, a file-writing and a networking one."""

import os
import tempfile
import time
from pathlib import Path

import pytest

from nanochat_hf.evaluation import EVAL_TASKS, load_problems, run_program
from nanochat_hf.evaluation.tasks import check_humaneval, humaneval_program


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


def test_completions_that_pass(problem, scratch):
    assert check_humaneval(problem, "    return a + b\n")  # the body, as HumanEval's canonical solution
    full = "Here it is:\n```python\ndef add(a, b):\n    return math.fsum([a, b])\n```\n"
    assert "import math" in humaneval_program(problem, full)  # the prompt's imports come along
    assert check_humaneval(problem, full)
    assert list(scratch.iterdir()) == []


def test_wrong_completion_fails_with_the_reason(problem, scratch):
    result = run_program(humaneval_program(problem, "    return a - b\n"))
    assert not result.passed and result.reason.startswith("failed (exit 1): AssertionError")


@pytest.mark.slow
def test_endless_loop_is_killed_and_scored_zero(problem, scratch):
    result = run_program(humaneval_program(problem, "    while True:\n        pass\n"), timeout=2.0)
    assert (result.passed, result.reason) == (False, "timeout after 2s")
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_file_writing_completion_is_killed_and_leaves_nothing(problem, scratch, tmp_path):
    # writes into its cwd, $HOME and $TMPDIR, leaves a child process (its output not tied to the sandbox's
    # pipes) and loops
    pid_file = tmp_path / "child.pid"
    body = ("    import os, subprocess, sys, tempfile\n"
            "    for d in ('.', os.environ['HOME'], tempfile.gettempdir()):\n"
            "        open(os.path.join(d, 'junk.txt'), 'w').write('x' * 1000)\n"
            "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
            "                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "    while True:\n        pass\n")
    before = set(os.listdir(os.getcwd()))
    result = run_program(humaneval_program(problem, body), timeout=3.0)
    assert (result.passed, result.reason) == (False, "timeout after 3s")
    assert list(scratch.iterdir()) == []  # the working directory (its HOME and TMPDIR) is gone
    assert set(os.listdir(os.getcwd())) == before
    # the child was killed with the group (SIGKILL was sent; on a loaded machine it may take a moment to land)
    status = Path(f"/proc/{pid_file.read_text()}/status")
    deadline = time.monotonic() + 10
    while _alive(status) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(status)


def _alive(status: Path) -> bool:
    """Whether the process of /proc/<pid>/status still runs (a zombie has exited)."""
    try:
        return "State:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False

def test_network_and_big_files_are_refused(scratch):
    assert run_program("import socket\nsocket.create_connection(('127.0.0.1', 80))\n").reason.endswith(
        "OSError: network access is disabled in the evaluation sandbox")
    assert not run_program("open('big', 'wb').write(b'x' * (64 << 20))\n", max_file_mb=1).passed
    assert not run_program("x = bytearray(4 << 30)\n", memory_mb=512).passed
    assert list(scratch.iterdir()) == []
