"""The one loader of a hub task's rows, for the training mixture and the chat evaluation alike.

Rows load through ``datasets.load_dataset`` under the task's hub name, or, with ``data_files`` (json / jsonl /
parquet in the hub dataset's column layout) or ``path`` (a local dataset folder), from local files. Right after
loading they are shuffled with ``Dataset.shuffle(seed=42)``, as nanochat's tasks do, so that a slice (the first
5200 MMLU test rows, the first 100 problems) picks nanochat's rows. Each row keeps its row number in the source
(column ``SOURCE_ROW``) for messages about it. Data that cannot be read raises `DataLoadError`, one line.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from ..errors import UserError, one_line
from .common import Task

HUB_SHUFFLE_SEED = 42
SOURCE_ROW = "__source_row__"  # row number in the source, kept through the shuffle (an in-memory column)

if TYPE_CHECKING:
    from datasets import Dataset


class DataLoadError(UserError):
    """A task's data cannot be read (a bad file, the hub unreachable or offline); the message is one line."""


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")  # huggingface_hub's, datasets'
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub's, where HF_ENDPOINT does not say another
PROBE_TIMEOUT_S = 5.0


def hub_off(probe_timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why this process cannot load from the hub, or None when it can: one of OFFLINE_VARIABLES is set, or the hub
    does not answer one request (no retries) within `probe_timeout` seconds; then HF_HUB_OFFLINE=1 is set for this
    process, so that cached rows load at once and the others fail at once, where each load would otherwise retry
    for a minute. Call it before datasets and huggingface_hub are imported (they read the variable then): at a
    command's start."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE"):
            return f"{name}={os.environ[name]} is set"
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT)
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=probe_timeout).close()
    except urllib.error.HTTPError:  # an answer, whatever its status: the hub is there
        return None
    except (OSError, ValueError):  # no network, refused, timed out, a malformed HF_ENDPOINT
        os.environ["HF_HUB_OFFLINE"] = "1"
        return f"the hub ({endpoint}) cannot be reached"
    return None


def check_data_file(path: str, where: str) -> None:
    """One-line DataLoadError for a local data file that is empty or not in its extension's format. Reads only the
    start (and a parquet file's footer): data files can be large; deeper damage is reported when loading."""
    with open(path, "rb") as f:
        if path.endswith(".parquet"):  # parquet files start and end with the magic bytes PAR1
            head = f.read(4)
            f.seek(max(os.path.getsize(path) - 4, 0))
            if os.path.getsize(path) < 12 or head != b"PAR1" or f.read(4) != b"PAR1":
                raise DataLoadError(f"{where}: data file {path} is not a parquet file (empty or damaged)")
            return
        number, first = next(((i, line) for i, line in enumerate(f, 1) if line.strip()), (0, None))
    if first is None:
        raise DataLoadError(f"{where}: data file {path} is empty (expected rows as JSON objects)")
    if path.endswith(".json") and first.lstrip()[:1] in (b"[", b"{"):
        return  # one JSON document (a list, or an object of columns) may span many lines
    try:
        json.loads(first)
    except (ValueError, UnicodeDecodeError) as e:
        reason = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise DataLoadError(
            f"{where}: data file {path} line {number} is not JSON ({reason}); expected one JSON object per line"
        ) from None


def load_rows(
    task: Task,
    split: str,
    where: str,
    *,
    data_files: list[str] | None = None,
    path: str | None = None,
    config: str | None = None,
    cache_dir: str | None = None,
) -> tuple[Dataset, str]:
    """(rows shuffled with seed 42, with their source row numbers in column SOURCE_ROW; the source's name for
    messages). `where` starts every error message ("task mmlu[train]", "ARC-Easy")."""
    from datasets import load_dataset  # here, not at the top: the task registry is read by every command's --help
    from datasets.exceptions import DatasetsError

    if data_files:
        builder = "parquet" if all(f.endswith(".parquet") for f in data_files) else "json"
        source = ", ".join(data_files)
        for f in data_files:
            check_data_file(f, where)
        try:
            ds = load_dataset(builder, data_files={split: list(data_files)}, split=split, cache_dir=cache_dir)
        except (DatasetsError, ValueError, OSError) as e:
            cause = e.__cause__ or e  # datasets wraps the parser's error
            raise DataLoadError(
                f"{where}: data file(s) {source} cannot be read as {builder} ({one_line(cause)})"
            ) from None
        if len(ds) == 0:
            raise DataLoadError(f"{where}: data file(s) {source} hold no rows")
    else:
        name = path or task.dataset
        config = config or (None if os.path.isdir(name) else task.config(split))
        source = name + (f"/{config}" if config else "")
        try:
            ds = load_dataset(name, config, split=split, cache_dir=cache_dir)
        except (DatasetsError, ValueError, OSError) as e:  # OSError: ConnectionError, a missing file
            raise DataLoadError(
                f"{where}: could not load {source} split {split!r} ({one_line(e)}); offline? give local files of "
                "the same layout with data_files"
            ) from None
    return ds.add_column(SOURCE_ROW, range(len(ds))).shuffle(seed=HUB_SHUFFLE_SEED), source
