"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# Prepended to a child's code: `import nanochat_hf` fails there although the package is installed (editable) in
# the venv, so the child shows what a user without our package gets.
BLOCK_PACKAGE = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "nanochat_hf" or name.startswith("nanochat_hf."):
            raise ModuleNotFoundError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Block())
"""


# Started in the background (`pytest &` in a script, `nohup`), this process ignores SIGINT, and so would every
# process a test starts: the Ctrl-C tests' SIGINT would do nothing. A handler here is reset to the default in each
# child, so the children's Python takes Ctrl-C as a terminal's does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest-xdist (`-n 2` in pyproject's addopts): each worker computes with one thread, and so does every process a
# test starts (two workers on two cores; a second torch thread would only spin-wait for a busy core).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# The folders whose session fixtures (trained runs, a served model, gloo launches, converted checkpoints) several
# test files share run whole on one worker, so each fixture is built once; elsewhere each file is its own group.
_SHARED_FOLDERS = {"conversion", "integration", "optim", "serving"}
_SHARED_FILES = {"test_run.py": "pushed_run", "test_hub.py": "pushed_run"}  # tests/training's session fixture


def xdist_group(nodeid: str) -> str:
    """The group of the test `nodeid` ("tests/<folder>/.../test_x.py::name"): every test of a group runs on one
    xdist worker, one after another."""
    path = nodeid.split("::")[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[1] in _SHARED_FOLDERS:
        return parts[1]
    if len(parts) > 2 and parts[1] == "training" and parts[-1] in _SHARED_FILES:
        return _SHARED_FILES[parts[-1]]
    return path


def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope (a module's tests on one worker), with `xdist_group` as the scope. (Its own
    `--dist loadgroup` marks tests by rewriting their node ids, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker: the groups with the most slow tests first (the scheduler hands out groups in collection
    order), so that the longest work starts first and the two workers finish together."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(xdist_group(item.nodeid), []).append(item)
    ordered = sorted(groups.values(), key=lambda m: -sum(1 for i in m if i.get_closest_marker("slow")))
    items[:] = [item for members in ordered for item in members]


@pytest.fixture
def fresh_python(tmp_path):
    """run(code, *argv, allow_package=False): `code` in a fresh isolated interpreter (python -I, offline, its own
    remote-code module cache, no PYTHONPATH, no stdin) in tmp_path, without our package unless allowed."""

    def run(code: str, *argv: str, allow_package: bool = False) -> subprocess.CompletedProcess:
        env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        program = code if allow_package else BLOCK_PACKAGE + code
        return subprocess.run(
            [sys.executable, "-I", "-c", program, *argv],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run


@pytest.fixture
def two_ranks():
    """run(script, out): `python script RANK 2 PORT out` for ranks 0 and 1 (a gloo pair on a free local port, one
    thread each); fails the test with both logs unless both exit 0."""

    def run(script: str, out: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [sys.executable, script, str(r), "2", str(port), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        logs = [p.communicate(timeout=240)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), logs

    return run


@pytest.fixture(scope="session")
def load_script():
    """load_script(name): scripts/<name>.py as a module (loaded once per session), to call its `main(argv)` in this
    process: a case that needs no fresh interpreter skips the seconds of importing torch and transformers."""
    modules = {}

    def load(name: str):
        if name not in modules:
            spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
            modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[name])
        return modules[name]

    return load


@pytest.fixture
def emulated_bfloat16():
    """This process multiplies bfloat16 as a CPU without native bfloat16 (AVX2 only) does: oneDNN off, so torch
    emulates bfloat16 matrix products, 40-70x slower than float32."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    yield
    torch.backends.mkldnn.enabled = before


class _NoBfloat16Products(TorchFunctionMode):
    """A device that cannot multiply bfloat16 matrices at all (e.g. MPS before macOS 14): every bf16 product fails,
    with a two-line message (the refusal must still be one line)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("matmul", "__matmul__", "mm", "bmm") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args
        ):
            raise RuntimeError("bfloat16 matmul is not supported on this device\nsecond line")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def no_bfloat16_products():
    """``with no_bfloat16_products:`` runs the block as on a device that cannot multiply bfloat16 matrices."""
    return _NoBfloat16Products()
