"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.util
import os
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
