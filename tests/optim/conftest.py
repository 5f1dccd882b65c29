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


@pytest.fixture(scope="session")
def gloo_runs(helpers, tmp_path_factory):
    """The 2- and 3-process gloo checks of test_distributed, test_head_recipe, test_routing, test_bf16_embedding and
    test_generation_groups, in ONE spawn (helpers.spawn_jobs: a process costs seconds of imports, a check little).
    A worker that asserts inside fails the spawn with its traceback, and so every test using this fixture; rank 0
    lists each finished worker in <folder>/done. The others write their results: head0.0/, head5.0/ (max_grad_norm),
    routing/, bf16/rank0.pt, g5/out. Returns the folder."""
    import test_bf16_embedding
    import test_generation_groups

    root = tmp_path_factory.mktemp("gloo")
    for name in ("head0.0", "head5.0", "routing", "bf16", "g5"):
        (root / name).mkdir()
    helpers.spawn_jobs(
        (helpers.dist_worker, 2, 4),
        *((helpers.overlap_worker, 2, recipe) for recipe in ("2025-12", "2026-07")),
        (helpers.bucket_worker, 3),
        *((helpers.head_dist_worker, 2, str(root / f"head{norm}"), norm) for norm in (0.0, 5.0)),
        (helpers.archs_dist_worker, 2, 5, str(root / "routing")),
        (test_bf16_embedding.sharded_worker, 2, str(root / "bf16" / "rank0.pt")),
        (test_generation_groups.sharded_worker, 2, str(root / "g5" / "out")),
        log=str(root / "done"),
    )
    return root
