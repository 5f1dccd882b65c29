"""Tasks: each turns its source rows into conversation rows ``{"conversation": json, "task": name}``.

Hub-backed tasks (SmolTalk, MMLU, GSM8K) load through ``datasets.load_dataset`` with the real dataset name, or,
with ``data_files`` (json / jsonl / parquet in the hub dataset's column layout) or ``path`` (a local dataset
folder), from local files; the rows then go through the same conversion either way. Right after loading, the
rows are shuffled with ``Dataset.shuffle(seed=42)``, as nanochat's tasks do, so ``start``/``stop`` select the
same rows as nanochat's (e.g. the first 5200 of MMLU test). Malformed rows are skipped and reported by the
mixture loader (or raise with ``strict``), by their row number in the source.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from datasets import Dataset, Features, Value, load_dataset
from datasets import config as datasets_config
from datasets.exceptions import DatasetsError

from ..errors import one_line
from ..paths import cache_key, nanochat_base_dir
from ..tokenizer import chat_format
from . import conversation as conversation_module
from . import synthetic
from .conversation import check_messages, dumps

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
HUB_SHUFFLE_SEED = 42  # hub-backed tasks are shuffled with this seed right after loading
_SOURCE_ROW = "__source_row__"  # row number in the source, kept through the shuffle for error messages
DEMO_IDENTITY_FILE = Path(__file__).with_name("identity_demo.jsonl")


class DataLoadError(ValueError):
    """A task's data cannot be read (bad file, hub unreachable). A ValueError, as the other bad-input errors, so
    the command line tools report it in one line."""


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


# ---------------------------------------------------------------- row -> conversation


def render_mc(question: str, choices: list[str]) -> str:
    """Spec's multiple-choice user message (no space between '=' and the letter)."""
    lines = "".join(f"- {choice}={letter}\n" for letter, choice in zip(LETTERS, choices))
    return f"Multiple Choice question: {question}\n{lines}\nRespond only with the letter of the correct answer."


def mmlu_conversation(row: dict) -> dict:
    row = row["train"] if "train" in row else row  # auxiliary_train wraps each row in a `train` column
    question, choices, answer = row["question"], row["choices"], row["answer"]
    if not isinstance(question, str) or not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ValueError("question must be a string and choices a list of strings")
    if not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ValueError(f"answer {answer!r} is not an index into {len(choices)} choices")
    return {
        "messages": [
            {"role": "user", "content": render_mc(question, choices)},
            {"role": "assistant", "content": LETTERS[answer]},
        ]
    }


_CALC = re.compile(r"<<([^>]+)>>")


def gsm8k_parts(answer: str) -> list[dict]:
    """GSM8K answer -> assistant parts: `<<expr=result>>` becomes python(expr) + python_output(result).

    Every annotation has a text part before it and the answer a text part after the last one, empty ones
    included (before a leading annotation, between two adjacent ones), as nanochat's conversations have.
    """
    parts: list[dict] = []
    pos = 0
    for m in _CALC.finditer(answer):
        parts.append({"type": "text", "text": answer[pos : m.start()]})
        expr, _, result = m.group(1).rpartition("=")
        if not _:  # no '=': the whole annotation is the expression
            expr, result = m.group(1), ""
        parts.append({"type": "python", "text": expr})
        parts.append({"type": "python_output", "text": result})
        pos = m.end()
    parts.append({"type": "text", "text": answer[pos:]})
    return parts


def gsm8k_conversation(row: dict) -> dict:
    question, answer = row["question"], row["answer"]
    if not isinstance(question, str) or not isinstance(answer, str):
        raise ValueError("question and answer must be strings")
    if "#### " not in answer:
        raise ValueError("answer has no final '#### ' line")
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": gsm8k_parts(answer)}]}


def smoltalk_conversation(row: dict) -> dict:
    return {"messages": row["messages"]}


# ---------------------------------------------------------------- task registry


@dataclass(frozen=True)
class HubTask:
    dataset: str
    convert: Callable[[dict], dict]
    config: Callable[[str], str | None] = lambda split: None


def arithmetic_conversation(index: int, split: str) -> dict:
    return gsm8k_conversation(synthetic.arithmetic_row(index, split))


def multiple_choice_conversation(index: int, split: str) -> dict:
    return mmlu_conversation(synthetic.multiple_choice_row(index, split))


HUB_TASKS = {
    "smoltalk": HubTask("HuggingFaceTB/smol-smoltalk", smoltalk_conversation),
    "mmlu": HubTask("cais/mmlu", mmlu_conversation, lambda split: "auxiliary_train" if split == "train" else "all"),
    "gsm8k": HubTask("openai/gsm8k", gsm8k_conversation, lambda split: "main"),
}
SYNTHETIC_TASKS: dict[str, Callable[[int, str], dict]] = {  # (index, split) -> conversation
    "simple_spelling": synthetic.simple_spelling,
    "spelling_bee": synthetic.spelling_bee,
    "arithmetic": arithmetic_conversation,
    "multiple_choice": multiple_choice_conversation,
}
WORD_TASKS = ("simple_spelling", "spelling_bee")  # synthetic tasks that take a `words` list
FILE_TASKS = ("identity", "demo_identity")  # JSONL, one JSON array of messages per line
ALIASES = {"customjson": "identity"}  # nanochat's class name for the identity task
TASK_NAMES = sorted([*HUB_TASKS, *SYNTHETIC_TASKS, *FILE_TASKS])


def canonical_task_name(name: str) -> str | None:
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())  # "SpellingBee", "spelling-bee" -> "spellingbee"
    return ALIASES.get(key) or next((t for t in TASK_NAMES if t.replace("_", "") == key), None)


def identity_file(task: str) -> Path:
    """Default file of a JSONL task: the shipped demo file, or nanochat's identity file."""
    return DEMO_IDENTITY_FILE if task == "demo_identity" else default_identity_path()


def default_identity_path() -> Path:
    """nanochat's identity file: $NANOCHAT_BASE_DIR (or ~/.cache/nanochat)/identity_conversations.jsonl."""
    return nanochat_base_dir() / "identity_conversations.jsonl"


@dataclass
class TaskSpec:
    """One entry of a mixture (see configs/mixtures/*.yaml)."""

    task: str
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


@dataclass
class TaskResult:
    dataset: Dataset  # columns conversation, task
    source: str  # file(s) or hub name, for messages
    bad: list[tuple[int, str]]  # (row index in the source, reason) of skipped rows


_ROW_FEATURES = Features({"conversation": Value("string"), "task": Value("string"), "error": Value("string")})


def _convert_batch(batch: dict, task: str) -> dict:
    convert = HUB_TASKS[task].convert
    out = {"conversation": [], "task": [], "error": []}
    for i in range(len(batch[_SOURCE_ROW])):
        row = {k: v[i] for k, v in batch.items() if k != _SOURCE_ROW}
        try:
            conversation = convert(row)
            reason = check_messages(conversation["messages"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}" if not isinstance(e, KeyError) else f"missing field {e}"
        out["conversation"].append("" if reason else dumps(conversation))
        out["task"].append(task)
        out["error"].append(reason or "")
    return out


def _split_errors(ds: Dataset, source_rows: list[int]) -> tuple[Dataset, list[tuple[int, str]]]:
    """Drop the rows that failed to convert; return them as (row number in the source, reason), in source order."""
    errors = ds["error"]
    bad = sorted((source_rows[i], e) for i, e in enumerate(errors) if e)
    if bad:
        ds = ds.select([i for i, e in enumerate(errors) if not e])
    return ds.remove_columns("error"), bad


def _slice(n: int, spec: TaskSpec) -> range:
    return range(n)[spec.start : spec.stop]


def _load_hub(spec: TaskSpec, cache_dir: str | None, num_proc: int | None) -> TaskResult:
    hub = HUB_TASKS[spec.task]
    if spec.data_files:
        builder = "parquet" if all(f.endswith(".parquet") for f in spec.data_files) else "json"
        source = ", ".join(spec.data_files)
        try:
            ds = load_dataset(builder, data_files={spec.split: spec.data_files}, split=spec.split, cache_dir=cache_dir)
        except (DatasetsError, ValueError, OSError) as e:
            cause = e.__cause__ or e  # datasets wraps the parser's error
            raise DataLoadError(
                f"task {spec.label}: data file(s) {source} cannot be read as {builder} ({one_line(cause)})"
            ) from None
        if len(ds) == 0:
            raise DataLoadError(f"task {spec.label}: data file(s) {source} hold no rows")
    else:
        name = spec.path or hub.dataset
        config = spec.config or (None if os.path.isdir(name) else hub.config(spec.split))
        source = name + (f"/{config}" if config else "")
        try:
            ds = load_dataset(name, config, split=spec.split, cache_dir=cache_dir)
        except (DatasetsError, ValueError, OSError) as e:
            if datasets_config.HF_HUB_OFFLINE and not os.path.isdir(name):
                raise DataLoadError(
                    f"task {spec.label}: hub dataset {source} is not in the local cache and offline mode is on "
                    "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); give a local copy with `data_files:` (json / jsonl / "
                    "parquet files in the dataset's column layout)"
                ) from None
            raise DataLoadError(
                f"task {spec.label}: could not load {source} split {spec.split!r} "
                f"({one_line(e)}); offline? point `data_files` at local files of the same "
                "layout"
            ) from None
    # Shuffle first, then slice: start/stop then pick nanochat's rows. The source row numbers ride along (an
    # in-memory column, the files are not rewritten) so that skipped rows can be named as they are in the file.
    ds = ds.add_column(_SOURCE_ROW, range(len(ds))).shuffle(seed=HUB_SHUFFLE_SEED)
    rows = _slice(len(ds), spec)
    if len(rows) != len(ds):
        ds = ds.select(rows)
    source_rows = ds[_SOURCE_ROW]
    # cached under a key of the rows and the converting code (this module and the conversation checks)
    fingerprint = cache_key(ds._fingerprint, spec.task, sys.modules[__name__], conversation_module, chat_format)
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
    ds, bad = _split_errors(ds, source_rows)
    return TaskResult(ds, source, bad)


def _load_jsonl(spec: TaskSpec) -> TaskResult:
    path = Path(spec.path) if spec.path else identity_file(spec.task)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DataLoadError(f"task {spec.label}: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not any(line.strip() for line in lines):
        raise DataLoadError(f"task {spec.label}: {path} is empty (expected one JSON array of messages per line)")
    convs, bad = [], []
    for i in _slice(len(lines), spec):
        if not lines[i].strip():
            continue
        try:
            messages = json.loads(lines[i])
        except json.JSONDecodeError as e:
            bad.append((i, f"invalid JSON ({e.msg} at column {e.colno})"))
            continue
        # nanochat's rule for identity files: user/assistant only, string contents
        reason = check_messages(messages, allow_system=False, strings_only=True)
        if reason:
            bad.append((i, reason))
        else:
            convs.append(dumps({"messages": messages}))
    ds = Dataset.from_dict({"conversation": convs, "task": [spec.task] * len(convs)})
    return TaskResult(ds, str(path), bad)


def _load_synthetic(spec: TaskSpec) -> TaskResult:
    generate = SYNTHETIC_TASKS[spec.task]
    rows = _slice(spec.size, spec)
    kwargs = {"words": spec.words} if spec.words else {}
    convs = [dumps(generate(i, spec.split, **kwargs)) for i in rows]
    ds = Dataset.from_dict({"conversation": convs, "task": [spec.task] * len(convs)})
    return TaskResult(ds, f"synthetic {spec.split} seeds", [])


def load_task(spec: TaskSpec, cache_dir: str | None = None, num_proc: int | None = None) -> TaskResult:
    """Load one (already validated) task entry; repeats are applied by the mixture."""
    if spec.task in HUB_TASKS:
        return _load_hub(spec, cache_dir, num_proc)
    if spec.task in SYNTHETIC_TASKS:
        return _load_synthetic(spec)
    return _load_jsonl(spec)
