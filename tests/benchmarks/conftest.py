"""The benchmark scripts, loaded as modules (they live outside the package, in benchmarks/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:  # a benchmark imports its siblings as it does when run as a script
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def convergence() -> ModuleType:
    return _load("convergence")


@pytest.fixture(scope="module")
def throughput() -> ModuleType:
    return _load("throughput")


@pytest.fixture(scope="module")
def generation() -> ModuleType:
    return _load("generation")


@pytest.fixture(scope="module")
def embedding_memory() -> ModuleType:
    return _load("embedding_memory")


@pytest.fixture(scope="module")
def generations() -> ModuleType:
    return _load("generations")


@pytest.fixture(scope="module")
def onnx_speed() -> ModuleType:
    return _load("onnx_speed")


@pytest.fixture(scope="module")
def base_train_speed() -> ModuleType:
    return _load("base_train_speed")


@pytest.fixture(scope="module")
def base_train_memory() -> ModuleType:
    return _load("base_train_memory")
