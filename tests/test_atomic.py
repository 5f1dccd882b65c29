"""nanochat_hf.atomic: complete-or-nothing writes with the umask's mode, and a staging folder that deletes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nanochat_hf.atomic import make_temp_dir, remove_staging_leftovers, staged_dir, write_bytes, write_text


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_write_bytes_mode_and_atomicity(tmp_path, umask_027):
    target = tmp_path / "a.json"
    write_text(target, "old")
    assert target.read_text() == "old" and mode(target) == 0o640
    with pytest.raises(TypeError):
        write_bytes(target, "not bytes")  # fails while writing: the old content stays, no temporary is left
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert mode(make_temp_dir(tmp_path)) == 0o750


def test_staged_dir_new_target_appears_whole(tmp_path, umask_027):
    target = tmp_path / "new" / "out"
    with staged_dir(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.bin").write_bytes(b"x")
        assert not target.exists()
    assert (target / "sub" / "x.bin").read_bytes() == b"x"
    assert mode(target) == 0o750 and mode(target / "sub" / "x.bin") == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"]


def test_staged_dir_into_an_existing_folder(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("user")
    (target / "same.txt").write_text("same")
    (target / "b.txt").write_text("user's b")

    def stage(**kwargs):
        with staged_dir(target, **kwargs) as tmp:
            for name, text in (("a.txt", "new a"), ("b.txt", "new b"), ("same.txt", "same")):
                (tmp / name).write_text(text)

    with pytest.raises(FileExistsError, match=r"b\.txt: already exists \(pass --overwrite"):
        stage()
    assert not (target / "a.txt").exists()  # checked before anything moved
    with pytest.raises(FileExistsError, match=r"b\.txt: refusing to replace a source file"):
        stage(overwrite=True, protect=[target / "b.txt"])
    assert (target / "b.txt").read_text() == "user's b" and not (target / "a.txt").exists()
    stage(overwrite=True)
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "keep.txt": "user",
        "same.txt": "same",
        "a.txt": "new a",
        "b.txt": "new b",
    }


def test_staged_dir_error_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("user")
    with pytest.raises(RuntimeError):
        with staged_dir(target, overwrite=True) as tmp:
            (tmp / "keep.txt").write_text("half")
            raise RuntimeError("crash while writing")
    assert [p.name for p in target.iterdir()] == ["keep.txt"] and (target / "keep.txt").read_text() == "user"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        with staged_dir(tmp_path / "file"):
            pass


def test_leftovers_of_a_killed_staging_are_removed_and_nothing_else(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(RuntimeError), staged_dir(target) as staging:
        leftover = target / (staging.name + "-copy")  # what a killed process leaves: the staging folder, named so
        leftover.mkdir()
        (leftover / "model.safetensors").write_text("half")
        raise RuntimeError("killed")
    other = make_temp_dir(target, "elsewhere")  # another target's staging, and the user's own files
    (target / ".nanochat_hf-tmp-out.txt").write_text("a file, not a staging folder")
    (target / "mine").mkdir()
    remove_staging_leftovers(target)
    assert sorted(p.name for p in target.iterdir()) == sorted([other.name, ".nanochat_hf-tmp-out.txt", "mine"])
