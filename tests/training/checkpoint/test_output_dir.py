"""output_dir is checked before training: a file, an unwritable directory or another run's folder is refused in one
line, nothing the user had is touched, and the final save is staged inside output_dir (never in its parent).

The permission cases run in a subprocess as uid/gid 65534 (nobody): root, as on CI, ignores permissions.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nanochat_hf.atomic import TMP_PREFIX
from nanochat_hf.evaluation import sandbox
from nanochat_hf.training.checkpoint.layout import LOCK_FILE
from nanochat_hf.training.checkpoint.output_dir import (
    OutputDirError,
    prepare_output_dir,
    release_output_dir,
    staged_final_save,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def earlier_run(path: Path, *names: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.startswith("checkpoint-"):
            (path / name).mkdir()
            (path / name / "model.safetensors").write_bytes(b"old weights of " + name.encode())
        else:
            (path / name).write_text(f"earlier run's {name}")
    return path


def test_fresh_and_empty_dirs_are_created_and_accepted(tmp_path):
    assert prepare_output_dir(tmp_path / "a" / "b", overwrite_output_dir=False, resuming=False) == []
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == [LOCK_FILE]  # held by this run
    release_output_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []  # a run that wrote nothing leaves none of the folders it made
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "notes.txt").write_text("mine")  # unrelated files are not a run
    assert prepare_output_dir(tmp_path / "logs", False, False) == []


HOLDER = """
import sys
from nanochat_hf.training.checkpoint.output_dir import prepare_output_dir
prepare_output_dir(sys.argv[1], False, False)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_second_run_on_the_same_folder_is_refused_until_the_first_one_dies(tmp_path):
    """Slow: the lock is held by another live process (then that process dies), which imports the package
    (seconds)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline() == "held\n"
        for _ in range(2):  # refused, and the refusal takes nothing from the holder
            with pytest.raises(OutputDirError) as err:
                prepare_output_dir(out, overwrite_output_dir=True, resuming=True)
            message = str(err.value)
            assert "\n" not in message and message.startswith(
                f"output_dir {out} is in use by another run (pid {holder.pid} on "
            )
            assert (out / LOCK_FILE).is_file()
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
        holder.wait()
    assert prepare_output_dir(out, False, False) == []  # the stale lock file is no obstacle
    (out / "model.safetensors").write_text("trained")
    release_output_dir(out)
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]


def test_output_dir_that_is_a_file(tmp_path):
    target = tmp_path / "out"
    target.write_text("user data")
    for path in (target, target / "sub"):
        with pytest.raises(OutputDirError) as err:
            prepare_output_dir(path, overwrite_output_dir=True, resuming=False)
        assert "\n" not in str(err.value) and str(target) in str(err.value)
    assert target.read_text() == "user data"


@pytest.mark.parametrize(
    "names,described",
    [
        (("model.safetensors", "config.json"), "model.safetensors"),
        (("report.md",), "report.md"),
        (("checkpoint-10", "checkpoint-20"), "2 checkpoint-* folders"),
        (("checkpoint-5",), "1 checkpoint-* folder"),
    ],
)
def test_another_run_is_refused_unless_overwrite_or_resume(tmp_path, names, described):
    out = earlier_run(tmp_path / "out", *names)
    before = snapshot(out)
    with pytest.raises(OutputDirError) as err:
        prepare_output_dir(out, overwrite_output_dir=False, resuming=False)
    message = str(err.value)
    assert "\n" not in message and described in message and "--overwrite_output_dir" in message
    assert "--resume_from_checkpoint" not in message  # no complete checkpoint (trainer_state.json): nothing to resume

    (notice,) = prepare_output_dir(out, overwrite_output_dir=True, resuming=False)
    assert described in notice and "nothing is deleted now" in notice
    (notice,) = prepare_output_dir(out, overwrite_output_dir=False, resuming=True)
    assert "resuming" in notice
    release_output_dir(out)
    assert snapshot(out) == before  # refusing, overwriting-to-be and resuming all leave the earlier run intact


def test_output_dir_refusal_says_what_it_holds_and_only_advice_that_works(tmp_path):
    (tmp_path / "report.md").write_text("an earlier run")
    (tmp_path / "checkpoint-4").mkdir()  # incomplete: no trainer_state.json, nothing to resume
    with pytest.raises(OutputDirError) as refused:
        prepare_output_dir(tmp_path, overwrite_output_dir=False, resuming=False)
    assert str(refused.value) == (
        f"output_dir {tmp_path} already holds a run (report.md, 1 checkpoint-* folder): pass "
        "--overwrite_output_dir true to replace it, or choose another --output_dir"
    )
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    with pytest.raises(OutputDirError, match="--resume_from_checkpoint true to continue it"):
        prepare_output_dir(tmp_path, overwrite_output_dir=False, resuming=False)


def test_an_unfinished_final_save_alone_is_not_a_run(tmp_path):
    out = tmp_path / "out"
    (out / f"{TMP_PREFIX}out.killed").mkdir(parents=True)
    assert prepare_output_dir(out, False, False) == []
    assert (out / f"{TMP_PREFIX}out.killed").is_dir()
    release_output_dir(out)


def test_final_save_stages_inside_and_publishes_whole_files(tmp_path):
    out = earlier_run(tmp_path / "out", "model.safetensors", "notes.txt")
    (out / f"{TMP_PREFIX}out.killed").mkdir()
    (out / f"{TMP_PREFIX}out.killed" / "partial").write_text("from a save that was killed")
    with staged_final_save(out) as staging:
        assert staging.parent == out and list(staging.iterdir()) == []
        assert not (out / f"{TMP_PREFIX}out.killed").exists()  # the leftover is gone
        (staging / "model.safetensors").write_text("new weights")
        (staging / "config.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert (out / "model.safetensors").read_text() == "new weights"
    assert (out / "notes.txt").read_text() == "earlier run's notes.txt"

    (out / "report.md").mkdir()
    (out / "report.md" / "keep").write_text("user's")
    with pytest.raises(FileExistsError, match="is a directory"), staged_final_save(out) as staging:
        (staging / "report.md").write_text("new")
        (staging / "config.json").write_text('{"new": 1}')
    assert (out / "report.md" / "keep").read_text() == "user's" and (out / "config.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt", "report.md"]

    with pytest.raises(KeyboardInterrupt), staged_final_save(out) as staging:  # Ctrl-C while saving
        (staging / "model.safetensors").write_text("half")
        raise KeyboardInterrupt
    assert (out / "model.safetensors").read_text() == "new weights"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt", "report.md"]


# ---- as a user who obeys permissions -----------------------------------------------------------------------------

CHILD = """
import json, sys
from pathlib import Path
from nanochat_hf.training.checkpoint.output_dir import OutputDirError, prepare_output_dir, staged_final_save
results = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        results[name] = ["ok", prepare_output_dir(path, False, False)]
        with staged_final_save(path) as staging:
            (staging / "model.safetensors").write_text("trained")
        results[name].append(sorted(p.name for p in Path(path).iterdir()))
    except OutputDirError as e:
        results[name] = ["refused", str(e)]
print(json.dumps(results))
"""


def drop_privileges() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(cmd: list[str]) -> tuple[list[str], object]:
    """The command line and preexec_fn that run `cmd` as nobody (setpriv if present: the venv's python may live
    under root's 0700 home, which an exec after a plain setuid cannot reach)."""
    if os.geteuid() != 0:
        return cmd, None
    if shutil.which("setpriv"):
        return ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *cmd], None
    return cmd, drop_privileges


@pytest.fixture
def shared_tree():
    """A temp tree the unprivileged user can traverse (pytest's tmp_path is 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="nanochat-hf-perm-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def traversable_by_others(path: Path) -> bool:
    """Whether a user who is neither owner nor group can reach `path` (every folder on the way has o+x)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def expose_to_nobody(paths: list[Path]):
    """A preexec_fn (as root, Linux) giving the child a mount namespace in which a folder above `paths` that others
    cannot enter (a checkout under a 0700 `mktemp -d` folder) holds only those paths, as the HumanEval sandbox shows
    the interpreter to its unprivileged uid (`sandbox_launch._expose`); None if nothing needs it."""
    if os.geteuid() != 0 or all(traversable_by_others(p) for p in paths):
        return None
    spec = importlib.util.spec_from_file_location(
        "sandbox_launch", Path(sandbox.__file__).with_name("sandbox_launch.py")
    )
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)

    def expose() -> None:
        launch._libc("unshare", launch.CLONE_NEWNS)
        launch._mount(None, "/", None, launch.MS_REC | launch.MS_PRIVATE)  # nothing propagates back to the host
        launch._expose([str(p) for p in paths])

    return expose


def run_as_nobody(cases: dict[str, Path], home: Path) -> dict:
    needed = [REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix).resolve()]  # the package, the venv, the interpreter
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "HOME": str(home), "HF_HOME": str(home / "hf")}
    cmd, preexec = as_nobody([sys.executable, "-c", CHILD, json.dumps({k: str(v) for k, v in cases.items()})])
    expose = expose_to_nobody(needed)
    if expose is not None and preexec is not None:  # no setpriv: the namespace, then the setuid, in one preexec_fn
        preexec = lambda: (expose(), drop_privileges())  # noqa: E731
    elif expose is not None:
        preexec = expose
    try:
        proc = subprocess.run(
            cmd, check=False, env=env, capture_output=True, text=True, timeout=300, preexec_fn=preexec
        )
    except (OSError, subprocess.SubprocessError) as e:  # the exec failed after dropping privileges
        pytest.skip(f"cannot run python as uid {NOBODY} here: {e}")
    if proc.returncode != 0 and "Permission denied" in proc.stderr and "nanochat_hf" not in proc.stderr:
        pytest.skip(f"cannot run python as uid {NOBODY} here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_unwritable_dirs_refused_before_training_as_unprivileged_user(shared_tree):
    """Slow: the refusals need a process of an unprivileged user (file modes do not stop root), which imports torch
    and transformers (seconds)."""
    home = shared_tree / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    # 1. an existing output_dir the user cannot write (chmod'ed read-only), holding the user's files
    locked = shared_tree / "locked"
    locked.mkdir()
    (locked / "data.txt").write_text("user data")
    os.chown(locked, NOBODY, NOBODY)
    locked.chmod(0o555)
    # 2. output_dir to be created inside a parent the user cannot write
    ro_parent = shared_tree / "ro_parent"
    ro_parent.mkdir()
    ro_parent.chmod(0o555)
    # 3. the case: a writable output_dir whose parent is not writable; the final save must still land
    writable_in_ro = ro_parent / "out"
    writable_in_ro.mkdir()
    os.chown(writable_in_ro, NOBODY, NOBODY)
    before = snapshot(shared_tree)

    results = run_as_nobody({"locked": locked, "ro_parent": ro_parent / "new", "writable_in_ro": writable_in_ro}, home)

    status, message = results["locked"]
    assert status == "refused" and "\n" not in message
    assert f"output_dir {locked} is not writable (Permission denied)" in message
    status, message = results["ro_parent"]
    assert status == "refused" and "\n" not in message
    assert f"output_dir {ro_parent / 'new'} cannot be created: Permission denied" in message
    assert results["writable_in_ro"] == ["ok", [], [LOCK_FILE, "model.safetensors"]]  # no staging folder left
    assert (writable_in_ro / "model.safetensors").read_text() == "trained"
    after = snapshot(shared_tree)
    del after["ro_parent/out/model.safetensors"]
    assert {k: v for k, v in after.items() if not k.startswith("home/")} == before  # nothing else touched
    assert not (ro_parent / "new").exists() and sorted(p.name for p in locked.iterdir()) == ["data.txt"]
