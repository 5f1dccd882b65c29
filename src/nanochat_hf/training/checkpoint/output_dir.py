"""Checks on `output_dir` before training starts, and the staging of the final save.

A run must not find out after hours of training that it cannot write its model, and must not silently replace
another run's model, report or checkpoints. Nothing here deletes anything the user had.

A run holds its output_dir for as long as it runs: an flock on `LOCK_FILE` in it, which the kernel drops when the
process ends, however it ends; a second run on the same folder is refused. When the run ends (or is refused),
`release_output_dir` removes the lock file, and the folder itself if this run created it and wrote nothing.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...atomic import remove_staging_leftovers, staged_dir
from ...errors import UserError
from .layout import CHECKPOINT_RE, LOCK_FILE, RUN_FILES, TRAINER_STATE_FILE

_held: dict[Path, tuple[int, list[Path]]] = {}  # output_dir -> (lock fd, folders this run created, deepest first)


class OutputDirError(UserError):
    """output_dir cannot be used; the message is one line naming the directory and what to do."""


def _existing_run(output_dir: Path) -> list[str]:
    found = [name for name in RUN_FILES if (output_dir / name).exists()]
    checkpoints = [p for p in output_dir.iterdir() if CHECKPOINT_RE.match(p.name) and p.is_dir()]
    if checkpoints:
        found.append(f"{len(checkpoints)} checkpoint-* folder{'s' if len(checkpoints) > 1 else ''}")
    return found


def prepare_output_dir(output_dir: str | Path, overwrite_output_dir: bool, resuming: bool) -> list[str]:
    """Create output_dir, prove it is writable now, and refuse one holding another run; returns notices to print.

    Call on the main process before training. A directory holding a run is accepted when `resuming` (the caller
    then checks the run fingerprint) or with `overwrite_output_dir` (files are replaced as the new run writes them,
    nothing is deleted up front). Raises OutputDirError with one line otherwise.
    """
    path = Path(output_dir).absolute()
    if path.exists() and not path.is_dir():
        raise OutputDirError(
            f"output_dir {output_dir} is a file; expected a directory (or a path that does not exist yet)"
        )
    if path not in _held:
        _hold(path, output_dir)
    try:
        found = _existing_run(path)
        if not found:
            return []
        if resuming:
            return [f"output_dir {output_dir} holds an earlier run ({', '.join(found)}): resuming it"]
        if overwrite_output_dir:
            return [
                (
                    f"--overwrite_output_dir: {output_dir} holds an earlier run ({', '.join(found)}); this run "
                    "replaces those files as it writes its own (nothing is deleted now; old checkpoint-* folders "
                    "with other step numbers stay)"
                )
            ]
        # resuming needs a complete checkpoint (trainer_state.json is written last): advise it only when there is one
        resumable = any((p / TRAINER_STATE_FILE).is_file() for p in path.iterdir() if CHECKPOINT_RE.match(p.name))
        resume = "--resume_from_checkpoint true to continue it, " if resumable else ""
        raise OutputDirError(
            f"output_dir {output_dir} already holds a run ({', '.join(found)}): pass --overwrite_output_dir true to "
            f"replace it, {resume}or choose another --output_dir"
        )
    except OutputDirError:
        release_output_dir(output_dir)
        raise


def _hold(path: Path, shown: str | Path) -> None:
    """Create `path` (remembering which folders were new) and take its lock; OutputDirError if another run has it."""
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputDirError(f"output_dir {shown} cannot be created: {e.strerror} ({e.filename})") from None
    while True:
        try:  # creating the lock file also proves the folder writable (os.access ignores ACLs, read-only mounts)
            fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            _remove_empty(created)
            raise OutputDirError(
                f"output_dir {shown} is not writable ({e.strerror}); the trained model could not be saved there: "
                "fix its permissions or choose another --output_dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "a running process"
            os.close(fd)
            raise OutputDirError(
                f"output_dir {shown} is in use by another run ({holder}): wait for it to end or "
                "choose another --output_dir"
            ) from None
        try:
            if os.stat(path / LOCK_FILE).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run that held it removed the file as we opened it: lock the one there now
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    if not _held:
        atexit.register(release_output_dir)
    _held[path] = (fd, created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first; stops at the first that is not empty
        try:
            folder.rmdir()
        except OSError:
            return


def release_output_dir(output_dir: str | Path | None = None) -> None:
    """End this run's hold on output_dir (all it holds when None): the lock file goes, and the folders the run
    created, if it wrote nothing into them (a refused run leaves no empty output_dir behind)."""
    for path in [Path(output_dir).absolute()] if output_dir is not None else list(_held):
        if path not in _held:
            continue
        fd, created = _held.pop(path)
        try:
            os.unlink(path / LOCK_FILE)
        except OSError:
            pass
        os.close(fd)
        _remove_empty(created)


@contextmanager
def staged_final_save(output_dir: str | Path) -> Iterator[Path]:
    """Yield an empty folder inside output_dir for the final save; when the block ends without error its files are
    moved into output_dir, each by an atomic rename (`atomic.staged_dir`): a file is replaced whole, never
    half-written, files of an earlier save that this one does not write are kept. On error nothing moves and the
    staging folder is removed.

    Staging inside output_dir (same filesystem, and its parent may not be writable; output_dir itself was checked
    by `prepare_output_dir`). A leftover of a save that was killed is removed first: a run holds its output_dir.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_staging_leftovers(out)
    with staged_dir(out, overwrite=True) as staging:
        yield staging
