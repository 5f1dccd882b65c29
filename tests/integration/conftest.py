import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)


@pytest.fixture(scope="session")
def state_worker():
    """tests/integration/state_worker.py, importable by name so that spawned processes find its functions."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import state_worker

    return state_worker
