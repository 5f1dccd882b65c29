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
