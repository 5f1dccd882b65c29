"""Atomic writes: a file or a folder appears complete or not at all, with the usual umask-derived mode.

Python's ``tempfile.mkstemp`` / ``mkdtemp`` create 0600 files and 0700 folders, and that mode survives the rename
into place (a model unreadable to the group on a shared cluster). The helpers here give the temporaries the mode
a plain ``open()`` / ``mkdir()`` would have.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".nanochat_hf-tmp-"


def _temp_prefix(name: str) -> str:
    """How a temporary for `name` (a file being replaced, a folder being staged) is named: this prefix + random."""
    return f"{TMP_PREFIX}{name}."


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (setting it is racy with threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc: the only portable way to read it is to set it and put it back
    os.umask(mask)
    return mask


def _fix_mode(path: Path, base: int) -> None:
    os.chmod(path, base & ~current_umask())


@contextmanager
def replacing(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary file name beside `path` for a writer that wants a name (safetensors' ``save_file``); when
    the block ends without error the file is renamed over `path` (mode 0666 & ~umask, or `mode`), else removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path.name))
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is None:
            _fix_mode(tmp, 0o666)
        else:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path` (mode 0666 & ~umask, or `mode`)."""
    with replacing(path, mode) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    return write_bytes(path, text.encode("utf-8"), mode)


def make_temp_dir(parent: str | os.PathLike, name: str = "") -> Path:
    """An empty new folder in `parent` with mode 0777 & ~umask (mkdtemp's is 0700)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=_temp_prefix(name)))
    _fix_mode(tmp, 0o777)
    return tmp


def remove_staging_leftovers(target: str | os.PathLike) -> None:
    """Remove the staging folders a killed `staged_dir(target)` left inside `target` (call it only where no other
    process can be staging into `target` now, e.g. an output_dir this run holds)."""
    target = Path(target)
    for path in target.iterdir():
        if path.name.startswith(_temp_prefix(target.name)) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _staged_files(tmp: Path) -> list[Path]:
    return sorted(p.relative_to(tmp) for p in tmp.rglob("*") if not p.is_dir())


@contextmanager
def staged_dir(
    target: str | os.PathLike, overwrite: bool = False, protect: Iterable[str | os.PathLike] = ()
) -> Iterator[Path]:
    """Yield an empty staging folder; when the block ends without error its files land in `target`.

    A new `target` is staged beside it and renamed into place (it appears complete or not at all). An existing
    `target` is staged inside it and the staged files are moved in one by one (each move atomic): files of
    `target` the block did not write are kept. Staged files get mode 0666 & ~umask, folders 0777 & ~umask.
    Before anything moves, every destination is checked: an existing file that already holds the same bytes is
    left as it is; a different one is replaced only with `overwrite`, and a file in `protect` never
    (FileExistsError naming it). On error the staging folder is removed and `target` is untouched.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target}: exists and is not a directory")
    exists = target.is_dir()
    if not exists:
        target.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(target if exists else target.parent, target.name)
    try:
        yield tmp
        for path in tmp.rglob("*"):  # some writers make 0600 files (safetensors' save_file): usual modes for all
            _fix_mode(path, 0o777 if path.is_dir() else 0o666)
        if not exists and not target.exists():
            os.rename(tmp, target)
            return
        protected = {Path(p).resolve() for p in protect}
        moves = []
        for rel in _staged_files(tmp):
            dst = target / rel
            if dst.is_file() and filecmp.cmp(tmp / rel, dst, shallow=False):
                continue  # already there, byte for byte
            moves.append(rel)
            if dst.exists() and dst.resolve() in protected:
                raise FileExistsError(f"{dst}: refusing to replace a source file (write to another directory)")
            if (dst.exists() or dst.is_symlink()) and not overwrite:
                raise FileExistsError(f"{dst}: already exists (pass --overwrite to replace it)")
            if dst.is_dir():
                raise FileExistsError(f"{dst}: is a directory, cannot be replaced by a file")
        for rel in moves:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, target / rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when renamed into place
