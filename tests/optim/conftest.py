import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)


@pytest.fixture(scope="session")
def helpers():
    """tests/optim/optim_helpers.py, importable by name so spawned workers can unpickle functions from it."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import optim_helpers

    return optim_helpers
