"""Task mixtures declared in YAML, and the embedded offline demo mixture.

A mixture file is either one mixture::

    seed: 42                 # shuffle seed (default 42)
    tasks:
      - {task: smoltalk, split: train}
      - {task: mmlu, split: train, config: auxiliary_train}
      - {task: gsm8k, split: test, stop: 420}
      - {task: identity, path: ~/.cache/nanochat/identity_conversations.jsonl, repeat: 2}
      - {task: simple_spelling, split: train, size: 200000}

or several, keyed by split name (``train: {seed, tasks}``, ``val: {...}``), chosen with ``split``.
``task`` names a task of the registry (`nanochat_hf.tasks.MIXTURE_TASKS`: its key or nanochat's name), which loads
and converts the rows; a hub task's rows are reported by their row number in the source when malformed (skipped,
or raised with ``strict``). Task keys: task, split, start, stop, repeat, size (synthetic tasks), path, config,
data_files, words (see TaskSpec).
``words`` (simple_spelling, spelling_bee): the word list to draw from, "full" (default, nanochat's tasks) or
"demo" (256 short words, for the offline demo; see words.py).
In a single-mixture file, a task without ``split`` uses "train" when loading split "train", else "test".
Relative paths are resolved against the YAML file's folder; ``~`` and ``$VARS`` are expanded.

The rows of all tasks are concatenated in the file's order (repeats adjacent) and shuffled with
``random.Random(seed).shuffle`` over the row indices, which is the order nanochat's TaskMixture produces
for the same task lengths.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from datasets import Dataset, Features, Value, concatenate_datasets

from .. import tasks  # the registry; a module (not its names): the tasks import data.words, which imports this
from ..errors import UserError
from ..paths import cache_key
from ..tokenizer import chat_format
from . import conversation as conversation_module
from .conversation import check_messages, dumps
from .words import WORD_LISTS

logger = logging.getLogger("nanochat_hf.data")

DEFAULT_SEED = 42
MIXTURE_KEYS = {"seed", "tasks", "name", "description"}


@dataclass
class TaskSpec:
    """One entry of a mixture (see configs/mixtures/*.yaml)."""

    task: str  # the task's mixture key (nanochat_hf.tasks.MIXTURE_TASKS)
    split: str = "train"
    start: int = 0
    stop: int | None = None
    repeat: int = 1
    size: int | None = None  # synthetic tasks: number of rows
    path: str | None = None  # hub dataset name / local dataset folder / identity JSONL file
    config: str | None = None  # hub dataset config ("auxiliary_train", "all", "main")
    data_files: list[str] = field(default_factory=list)  # local json/jsonl/parquet files (hub tasks)
    words: str | None = None  # spelling tasks: word list name (words.py; None = "full")

    @property
    def label(self) -> str:
        return f"{self.task}[{self.split}]"


TASK_KEYS = {f.name for f in dataclasses.fields(TaskSpec)}

# The offline demo: everything generated or shipped, nothing downloaded. ~17K train conversations. The spelling
# tasks draw from the small `demo` word list (words.py), so held-out rows ask for words the tiny model has seen.
DEMO_MIXTURE: dict[str, Any] = {
    "name": "offline demo mixture",
    "train": {
        "seed": DEFAULT_SEED,
        "tasks": [
            {"task": "simple_spelling", "split": "train", "size": 8000, "words": "demo"},
            {"task": "spelling_bee", "split": "train", "size": 3000, "words": "demo"},
            {"task": "arithmetic", "split": "train", "size": 3000},
            {"task": "multiple_choice", "split": "train", "size": 3000},
            {"task": "demo_identity", "repeat": 8},
        ],
    },
    "val": {
        "seed": DEFAULT_SEED,
        "tasks": [
            {"task": "simple_spelling", "split": "test", "size": 100, "words": "demo"},
            {"task": "spelling_bee", "split": "test", "size": 100, "words": "demo"},
            {"task": "arithmetic", "split": "test", "size": 100},
            {"task": "multiple_choice", "split": "test", "size": 100},
        ],
    },
    # held-out SimpleSpelling rows (test seeds, disjoint from val's) for exact-match accuracy
    "spelling_eval": {
        "seed": DEFAULT_SEED,
        "tasks": [
            {"task": "simple_spelling", "split": "test", "start": 1000, "size": 1200, "words": "demo"},
        ],
    },
}


def _expand(value: str, base: Path | None) -> str:
    p = Path(os.path.expandvars(os.path.expanduser(value)))
    return str(p if p.is_absolute() or base is None else base / p)


def _keys(which: Callable[[tasks.Task], bool]) -> str:
    """The mixture keys of the tasks `which` selects, for messages."""
    return ", ".join(key for key, task in tasks.MIXTURE_TASKS.items() if which(task))


def _parse_task(entry: Any, where: str, split: str, base: Path | None) -> TaskSpec:
    if not isinstance(entry, dict) or "task" not in entry:
        raise UserError(f"{where}: each task entry must be a mapping with a 'task' key, got {entry!r}")
    unknown = sorted(set(entry) - TASK_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(TASK_KEYS))})")
    found = tasks.mixture_task(entry["task"])
    if found is None:
        raise UserError(f"{where}: unknown task {entry['task']!r} (known: {', '.join(tasks.MIXTURE_TASKS)})")
    task, kind = found.key, found.kind
    where = f"{where} ({task})"
    spec = TaskSpec(**{**entry, "task": task})
    if "split" not in entry:
        spec.split = "train" if split == "train" else "test"
    for key, minimum in (("start", 0), ("stop", 0), ("repeat", 1), ("size", 1)):
        value = getattr(spec, key)
        if value is None and key in ("stop", "size"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            sign = "positive" if minimum else "non-negative"
            raise UserError(f"{where}: {key} must be a {sign} integer, got {value!r}")
    for key in ("split", "path", "config", "words"):
        value = getattr(spec, key)
        if value is not None and not isinstance(value, str):
            raise UserError(f"{where}: {key} must be a string, got {value!r}")
    if kind == "synthetic" and spec.size is None:
        raise UserError(f"{where}: synthetic task needs 'size' (number of rows)")
    if kind != "synthetic" and spec.size is not None:
        raise UserError(f"{where}: 'size' only applies to synthetic tasks ({_keys(lambda t: t.kind == 'synthetic')})")
    if spec.words is not None and not found.words:
        raise UserError(f"{where}: 'words' only applies to {_keys(lambda t: t.words)}")
    if spec.words is not None and spec.words not in WORD_LISTS:
        raise UserError(f"{where}: unknown word list {spec.words!r} (expected one of: {', '.join(WORD_LISTS)})")
    if spec.data_files and kind != "hub":
        raise UserError(f"{where}: 'data_files' only applies to hub tasks ({_keys(lambda t: t.kind == 'hub')})")
    files = [spec.data_files] if isinstance(spec.data_files, str) else spec.data_files or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise UserError(f"{where}: data_files must be a file name or a list of file names, got {spec.data_files!r}")
    spec.data_files = [_expand(f, base) for f in files]
    for f in spec.data_files:
        if not f.endswith((".json", ".jsonl", ".parquet")):
            raise UserError(f"{where}: data file {f} must be .json, .jsonl or .parquet")
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{where}: data file not found: {f}")
        tasks.check_data_file(f, where)
    if spec.path is not None:
        local = _expand(spec.path, base)
        if kind == "file" or os.path.exists(local):  # otherwise a hub name like "cais/mmlu"
            spec.path = local
    if kind == "file":
        path = spec.path or str(found.default_file())
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{where}: conversation file not found: {path}")
    return spec


def parse_mixture(
    config: dict, split: str = "train", source: str = "<mixture>", base: Path | None = None
) -> tuple[int, list[TaskSpec]]:
    """Validate a mixture mapping (already read from YAML); returns (seed, task specs). Raises on any error."""
    if not isinstance(config, dict):
        raise UserError(f"{source}: a mixture must be a mapping with 'tasks', got {type(config).__name__}")
    if "tasks" not in config:  # keyed by split
        if split not in config or split in MIXTURE_KEYS:
            splits = sorted(k for k in config if k not in MIXTURE_KEYS)
            raise UserError(
                f"{source}: no 'tasks' and no split {split!r} (splits in file: {', '.join(splits) or 'none'})"
            )
        config, source = config[split], f"{source} [{split}]"
        if not isinstance(config, dict) or "tasks" not in config:
            raise UserError(f"{source}: each split must be a mapping with 'tasks'")
    unknown = sorted(set(config) - MIXTURE_KEYS)
    if unknown:
        raise UserError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(MIXTURE_KEYS))})")
    seed = config.get("seed", DEFAULT_SEED)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"{source}: seed must be an integer, got {seed!r}")
    entries = config["tasks"]
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{source}: empty mixture ('tasks' must be a non-empty list)")
    return seed, [_parse_task(t, f"{source} task #{i}", split, base) for i, t in enumerate(entries)]


def read_mixture(path: str | os.PathLike | None, split: str = "train") -> tuple[int, list[TaskSpec], str]:
    """Parse and validate a mixture file (None = the demo); (seed, specs, name). Touches no dataset."""
    if path is None:
        seed, specs = parse_mixture(DEMO_MIXTURE, split, "offline demo mixture")
        return seed, specs, "offline demo mixture"
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mixture file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:  # its message spans several lines: keep the problem and where it is
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{path}: not valid YAML ({problem}{at})") from None
    seed, specs = parse_mixture(config, split, str(path), path.parent)
    return seed, specs, str(path)


# ---------------------------------------------------------------- loading one entry


@dataclass
class TaskResult:
    dataset: Dataset  # columns conversation, task
    source: str  # file(s) or hub name, for messages
    bad: list[tuple[int, str]]  # (row index in the source, reason) of skipped rows


_ROW_FEATURES = Features({"conversation": Value("string"), "task": Value("string"), "error": Value("string")})


def _convert_batch(batch: dict, task: str) -> dict:
    convert = tasks.MIXTURE_TASKS[task].conversation
    out = {"conversation": [], "task": [], "error": []}
    for i in range(len(batch[tasks.SOURCE_ROW])):
        row = {k: v[i] for k, v in batch.items() if k != tasks.SOURCE_ROW}
        try:
            conversation = convert(row)
            reason = check_messages(conversation["messages"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}" if not isinstance(e, KeyError) else f"missing field {e}"
        out["conversation"].append("" if reason else dumps(conversation))
        out["task"].append(task)
        out["error"].append(reason or "")
    return out


def _slice(n: int, spec: TaskSpec) -> range:
    return range(n)[spec.start : spec.stop]


def _load_hub(spec: TaskSpec, cache_dir: str | None, num_proc: int | None) -> TaskResult:
    ds, source = tasks.load_rows(
        tasks.MIXTURE_TASKS[spec.task],
        spec.split,
        f"task {spec.label}",
        data_files=spec.data_files,
        path=spec.path,
        config=spec.config,
        cache_dir=cache_dir,
    )
    rows = _slice(len(ds), spec)  # slices of the shuffled rows: nanochat's rows
    if len(rows) != len(ds):
        ds = ds.select(rows)
    source_rows = ds[tasks.SOURCE_ROW]
    # cached under a key of the rows and the converting code (the tasks, this module, the conversation checks)
    fingerprint = cache_key(ds._fingerprint, spec.task, tasks, sys.modules[__name__], conversation_module, chat_format)
    ds = ds.map(
        _convert_batch,
        batched=True,
        fn_kwargs={"task": spec.task},
        remove_columns=ds.column_names,
        features=_ROW_FEATURES,
        num_proc=num_proc,
        new_fingerprint=fingerprint,
        desc=f"Converting {spec.label}",
    )
    # drop the rows that failed to convert; report them by their row number in the source, in source order
    errors = ds["error"]
    bad = sorted((source_rows[i], e) for i, e in enumerate(errors) if e)
    if bad:
        ds = ds.select([i for i, e in enumerate(errors) if not e])
    return TaskResult(ds.remove_columns("error"), source, bad)


def _load_file(spec: TaskSpec) -> TaskResult:
    task = tasks.MIXTURE_TASKS[spec.task]
    path = Path(spec.path) if spec.path else task.default_file()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise tasks.DataLoadError(
            f"task {spec.label}: {path} is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    if not any(line.strip() for line in lines):
        raise tasks.DataLoadError(f"task {spec.label}: {path} is empty (expected one JSON array of messages per line)")
    convs, bad = [], []
    for i in _slice(len(lines), spec):
        if not lines[i].strip():
            continue
        try:
            convs.append(dumps(task.conversation(lines[i])))
        except ValueError as e:
            bad.append((i, str(e)))
    ds = Dataset.from_dict({"conversation": convs, "task": [spec.task] * len(convs)})
    return TaskResult(ds, str(path), bad)


def _load_synthetic(spec: TaskSpec) -> TaskResult:
    rows = _synthetic_rows(spec.task, spec.split, _slice(spec.size, spec), spec.words)
    return TaskResult(rows, f"synthetic {spec.split} seeds", [])


@functools.lru_cache(maxsize=32)
def _synthetic_rows(task: str, split: str, seeds: range, words: str | None) -> Dataset:
    """A synthetic task's rows: a pure function of its entry, generated once per process (the demo mixture's train
    split is 0.7 s of Python; a run asks for it twice, for its data and the demo tokenizer's texts, and so does each
    run a test session makes in-process). A Dataset is not changed in place by anything that reads it."""
    generate = tasks.MIXTURE_TASKS[task].conversation
    kwargs = {"words": words} if words else {}
    convs = [dumps(generate(i, split, **kwargs)) for i in seeds]
    return Dataset.from_dict({"conversation": convs, "task": [task] * len(convs)})


def load_task(spec: TaskSpec, cache_dir: str | None = None, num_proc: int | None = None) -> TaskResult:
    """Load one (already validated) mixture entry; repeats are applied by the mixture."""
    kind = tasks.MIXTURE_TASKS[spec.task].kind
    if kind == "hub":
        return _load_hub(spec, cache_dir, num_proc)
    if kind == "synthetic":
        return _load_synthetic(spec)
    return _load_file(spec)


def load_mixture(
    path: str | os.PathLike | None = None,
    split: str = "train",
    strict: bool = False,
    cache_dir: str | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """Load a mixture of conversations: a Dataset with columns ``conversation`` (JSON of nanochat's
    ``{"messages": [...]}``; decode with ``nanochat_hf.data.loads(row)``) and ``task``.

    ``path=None`` loads the embedded offline demo mixture (``DEMO_MIXTURE``: splits train, val, spelling_eval).
    Malformed source rows are skipped and summarised in one warning; ``strict=True`` raises on the first.
    Every entry is validated (unknown task/key, missing file, empty mixture) before any data is read.
    """
    seed, specs, name = read_mixture(path, split)
    if path is None:
        logger.info(
            "No mixture given: using the offline demo mixture (synthetic tasks + shipped identity "
            "file, no download), split %s",
            split,
        )
    parts, skipped = [], []
    for spec in specs:
        result = load_task(spec, cache_dir=cache_dir, num_proc=num_proc)
        if result.bad and strict:
            row, reason = result.bad[0]
            raise UserError(f"task {spec.label} ({result.source}) row {row}: {reason}")
        skipped += [(spec.label, result.source, row, reason) for row, reason in result.bad]
        parts += [result.dataset] * spec.repeat
    if skipped:
        counts: dict[str, int] = {}
        for label, *_ in skipped:
            counts[label] = counts.get(label, 0) + 1
        first = "; ".join(f"{t} ({s}) row {r}: {why}" for t, s, r, why in skipped[:5])
        logger.warning(
            "%s: skipped %d malformed row(s) (%s); first: %s",
            name,
            len(skipped),
            ", ".join(f"{t}: {n}" for t, n in counts.items()),
            first,
        )
    ds = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    if len(ds) == 0:
        raise UserError(f"{name} [{split}]: empty mixture (no valid conversation in any task)")
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    return ds.select(order)
