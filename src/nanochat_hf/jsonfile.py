"""JSON files: the one reader (a bad file is one line naming it) and the one writer (atomic, usual mode)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .atomic import write_text
from .errors import UserError, one_line


def read_json(path: str | os.PathLike, expect_object: bool = True) -> Any:
    """The parsed file. FileNotFoundError if it is missing; UserError (one line naming the file) if it is not valid
    JSON, or, with `expect_object`, not a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({one_line(e)})") from None
    if expect_object and not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomic JSON write (indented), mode 0666 & ~umask."""
    write_text(path, json.dumps(obj, indent=2))
