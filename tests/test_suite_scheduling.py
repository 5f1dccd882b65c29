"""The suite's own xdist scheduling (tests/conftest.py): the tests that share a fixture run on one worker."""

from xdist.scheduler import LoadScopeScheduling

from .conftest import pytest_xdist_make_scheduler, xdist_group


def test_the_files_that_share_a_session_fixture_are_one_group():
    files = ("test_fsdp_trl.py", "test_trainer_checkpoints.py")
    assert [xdist_group(f"tests/integration/{f}::t") for f in files] == ["integration", "integration"]
    assert xdist_group("tests/training/test_run.py::a") == xdist_group("tests/training/test_hub.py::b[2]")
    # elsewhere a file is a group (its module fixtures built once), and two files are two
    assert xdist_group("tests/training/test_fsdp2.py::a") == xdist_group("tests/training/test_fsdp2.py::b[2]")
    assert xdist_group("tests/training/test_fsdp2.py::a") != xdist_group("tests/training/test_multiprocess.py::a")


def test_xdist_schedules_by_our_groups():
    """xdist's scope scheduler asks its private `_split_scope` for each test's scope; ours answers the group (were
    it renamed, every test would be scheduled alone and each shared fixture built on both workers)."""

    class Config:  # what the scheduler reads of pytest's config: the workers
        def getvalue(self, name):
            return ["popen", "popen"] if name == "tx" else None

    scheduler = pytest_xdist_make_scheduler(Config(), log=None)
    assert isinstance(scheduler, LoadScopeScheduling) and "_split_scope" in vars(LoadScopeScheduling)
    assert scheduler._split_scope("tests/serving/test_chat.py::test_x[1]") == "serving"
    assert scheduler._split_scope("tests/model/test_model.py::test_y") == "tests/model/test_model.py"
