"""DCLM CORE (https://arxiv.org/abs/2406.11794) of a base model, as nanochat's base_eval.py / core_eval.py compute it.

The eval bundle is a folder: `core.yaml` (`icl_tasks`: label, icl_task_type, dataset_uri, num_fewshot,
continuation_delimiter), `eval_meta_data.csv` (each task's random baseline, in percent) and `eval_data/<uri>.jsonl`.
Each task's rows are shuffled with seed 1337 (then cut to `max_per_task`); example i gets its few-shot examples
from the other rows with `random.Random(1234 + i)`. Three kinds of task:

- multiple_choice (rows: query, choices, gold): one prompt per choice, the same context; the prediction is the
  choice whose tokens (after the common prefix) have the lowest mean loss;
- schema (rows: context_options, continuation, gold): one prompt per context, the same continuation; the lowest
  mean loss over the continuation (the common suffix) wins;
- language_modeling (rows: context, continuation): right when greedy decoding reproduces the continuation.

Every sequence starts with the tokenizer's BOS (EOS where it has none), as nanochat's tokenizer prepends
`<|bos|>`; text is encoded as plain text (special-token strings in it are not special). Examples are batched
(`batch_size` sequences per forward, right-padded with BOS as nanochat pads). Under torch.distributed each rank
takes every world_size-th example and the results are all-reduced. The score of a task is its accuracy, centered
on its random baseline: (acc - 0.01 * baseline) / (1 - 0.01 * baseline); CORE is the mean of the centered scores.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
import sys
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from ..errors import UserError, one_line
from ..paths import nanochat_base_dir
from ..progress import Progress

EVAL_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"  # nanochat's
# the fields each kind of task reads from its rows: (name, type); a list field holds strings
ROW_FIELDS = {
    "multiple_choice": (("query", str), ("choices", list), ("gold", int)),
    "schema": (("context_options", list), ("continuation", str), ("gold", int)),
    "language_modeling": (("context", str), ("continuation", str)),
}
SHUFFLE_SEED, FEWSHOT_SEED = 1337, 1234  # nanochat's
NANOCHAT_MODEL_TYPES = ("nanochat_gpt", "nanochat")  # rotary: never cropped, as nanochat's GPT


@dataclass
class CoreTask:
    """One task of the bundle, its rows shuffled (and cut to max_per_task) as nanochat's evaluate_core does."""

    label: str
    kind: str  # multiple_choice | schema | language_modeling
    num_fewshot: int
    delimiter: str
    random_baseline: float  # percent, as eval_meta_data.csv
    rows: list[dict]
    lines: list[int]  # each row's line number in its file (1-based), for messages
    path: Path


@dataclass
class ExampleScore:
    """What the model did on one example: `prediction` is the chosen option (multiple choice, schema) or 1/0
    (language modelling: the greedy tokens are the continuation); `losses` the mean loss of each option (of the
    continuation)."""

    prediction: int
    correct: bool
    losses: list[float]


# ---------------------------------------------------------------- the bundle


def default_bundle_dir() -> Path:
    """Where nanochat puts the eval bundle: $NANOCHAT_BASE_DIR/eval_bundle."""
    return nanochat_base_dir() / "eval_bundle"


def download_bundle(target: Path, url: str = EVAL_BUNDLE_URL) -> None:
    """Download nanochat's eval_bundle.zip and unzip its `eval_bundle/` folder to `target` (nothing is left at
    `target` unless the whole folder arrived)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        archive = Path(tmp) / "eval_bundle.zip"
        with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as f:
            shutil.copyfileobj(response, f)
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
        shutil.move(str(Path(tmp) / "eval_bundle"), str(target))


def ensure_bundle(bundle_dir: str | Path | None = None) -> Path:
    """The bundle folder; downloaded once (by rank 0) when it is not there. UserError in one line when it is
    neither there nor downloadable."""
    folder = Path(bundle_dir).expanduser() if bundle_dir is not None else default_bundle_dir()
    if folder.is_dir():
        return folder
    reason = "another process could not download it"
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"CORE: downloading the eval bundle from {EVAL_BUNDLE_URL} to {folder}", file=sys.stderr, flush=True)
        try:
            download_bundle(folder)
        except (OSError, zipfile.BadZipFile) as e:  # URLError is an OSError
            reason = one_line(e)
    if dist.is_initialized():
        dist.barrier()
    if not folder.is_dir():
        raise UserError(
            f"no eval bundle at {folder} and it could not be downloaded from {EVAL_BUNDLE_URL} ({reason}); "
            "unzip it there or pass --bundle_dir"
        )
    return folder


def _task_entries(config_path: Path) -> list[dict]:
    if not config_path.is_file():
        raise UserError(
            f"no core.yaml in {config_path.parent} (an eval bundle holds core.yaml, eval_meta_data.csv and eval_data/)"
        )
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{config_path}: not YAML ({one_line(e)})") from None
    entries = config.get("icl_tasks") if isinstance(config, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{config_path}: expected a non-empty list 'icl_tasks'")
    for i, entry in enumerate(entries):
        where = f"{config_path}: icl_tasks[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping")
        for key in ("label", "icl_task_type", "dataset_uri", "num_fewshot"):
            if key not in entry:
                raise UserError(f"{where}: no '{key}'")
        if entry["icl_task_type"] not in ROW_FIELDS:
            kinds = ", ".join(ROW_FIELDS)
            raise UserError(f"{where}: icl_task_type {entry['icl_task_type']!r}, expected one of {kinds}")
        shots = entry["num_fewshot"]
        if not (isinstance(shots, list) and shots and isinstance(shots[0], int) and shots[0] >= 0):
            raise UserError(f"{where}: num_fewshot {shots!r}, expected a list starting with an integer >= 0")
        if not isinstance(entry.get("continuation_delimiter", " "), str):
            raise UserError(f"{where}: continuation_delimiter must be a string")
    return entries


def _random_baselines(path: Path) -> dict[str, float]:
    if not path.is_file():
        raise UserError(f"no eval_meta_data.csv in {path.parent} (it holds each task's 'Random baseline')")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not {"Eval Task", "Random baseline"} <= set(reader.fieldnames or ()):
            raise UserError(f"{path}: expected the columns 'Eval Task' and 'Random baseline'")
        baselines = {}
        for n, row in enumerate(reader, start=2):
            try:
                baselines[row["Eval Task"]] = float(row["Random baseline"])
            except (TypeError, ValueError):
                raise UserError(
                    f"{path} line {n}: 'Random baseline' {row['Random baseline']!r} is not a number"
                ) from None
    return baselines


def _check_row(row, kind: str, where: str) -> None:
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object")
    for name, kind_of in ROW_FIELDS[kind]:
        if name not in row:
            names = ", ".join(n for n, _ in ROW_FIELDS[kind])
            raise UserError(f"{where}: no field '{name}' ({kind} rows have {names})")
        value = row[name]
        ok = isinstance(value, kind_of) and not isinstance(value, bool)
        if kind_of is list:
            ok = ok and len(value) > 0 and all(isinstance(v, str) for v in value)
        if not ok:
            expected = {str: "a string", list: "a non-empty list of strings", int: "an integer"}[kind_of]
            raise UserError(f"{where}: field '{name}' is {json.dumps(value)[:60]}, expected {expected}")
    if "gold" in row:
        options = row["choices" if kind == "multiple_choice" else "context_options"]
        if not 0 <= row["gold"] < len(options):
            raise UserError(f"{where}: field 'gold' is {row['gold']}, expected an index of its {len(options)} options")


def _read_rows(path: Path, kind: str) -> tuple[list[dict], list[int]]:
    rows, lines = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {n}"
            try:
                row = json.loads(line.strip())
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not JSON ({one_line(e)})") from None
            _check_row(row, kind, where)
            rows.append(row)
            lines.append(n)
    return rows, lines


def load_bundle(bundle_dir: str | Path, max_per_task: int = -1) -> list[CoreTask]:
    """The bundle's tasks in core.yaml's order, every row checked; UserError in one line naming the file (and the
    line and field) that is missing or malformed."""
    bundle_dir = Path(bundle_dir)
    entries = _task_entries(bundle_dir / "core.yaml")
    baselines = _random_baselines(bundle_dir / "eval_meta_data.csv")
    tasks = []
    for entry in entries:
        label, kind = str(entry["label"]), entry["icl_task_type"]
        path = bundle_dir / "eval_data" / entry["dataset_uri"]
        if not path.is_file():
            raise UserError(f"task {label}: no task file {path} (core.yaml's dataset_uri {entry['dataset_uri']!r})")
        if label not in baselines:
            raise UserError(f"task {label}: no row 'Eval Task' = {label!r} in {bundle_dir / 'eval_meta_data.csv'}")
        rows, lines = _read_rows(path, kind)
        order = list(range(len(rows)))
        random.Random(SHUFFLE_SEED).shuffle(order)  # the permutation nanochat's shuffle of the rows makes
        if max_per_task > 0:
            order = order[:max_per_task]
        shots = entry["num_fewshot"][0]
        if len(order) < shots + 1:
            raise UserError(f"task {label}: {shots}-shot needs at least {shots + 1} rows, {path} gives {len(order)}")
        tasks.append(
            CoreTask(
                label,
                kind,
                shots,
                entry.get("continuation_delimiter", " "),
                baselines[label],
                [rows[i] for i in order],
                [lines[i] for i in order],
                path,
            )
        )
    return tasks


# ---------------------------------------------------------------- prompts and tokens


def fewshot_indices(n_rows: int, idx: int, num_fewshot: int) -> list[int]:
    """The rows that are example idx's few-shot examples (never idx itself), as nanochat draws them."""
    if num_fewshot == 0:
        return []
    others = [i for i in range(n_rows) if i != idx]
    return random.Random(FEWSHOT_SEED + idx).sample(others, num_fewshot)


def render_prompts(task: CoreTask, idx: int) -> list[str]:
    """Example idx's prompts: one per choice (multiple choice) or context (schema); for language modelling the
    prompt without the continuation (stripped) and the prompt with it."""
    item, d = task.rows[idx], task.delimiter
    shots = [task.rows[i] for i in fewshot_indices(len(task.rows), idx, task.num_fewshot)]
    if task.kind == "multiple_choice":
        prefix = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{prefix}{item['query']}{d}{choice}" for choice in item["choices"]]
    if task.kind == "schema":
        prefix = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{prefix}{context}{d}{item['continuation']}" for context in item["context_options"]]
    prefix = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in shots)
    without = f"{prefix}{item['context'].strip()}{d}"
    return [without.strip(), without + item["continuation"]]


def _common_length(seqs: list[list[int]], from_end: bool) -> int:
    """Length of the prefix (suffix) all sequences share."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        pos = -1 - i if from_end else i
        if any(s[pos] != seqs[0][pos] for s in seqs):
            return i
    return n


def bos_id(tokenizer) -> int:
    """The id every sequence starts with (and padding): BOS, else EOS (GPT-2's <|endoftext|> is both)."""
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    raise UserError("the tokenizer has neither a BOS nor an EOS token to start each sequence with")


def example_tokens(
    task: CoreTask, idx: int, tokenizer, bos: int, max_seq_len: int | None = None
) -> tuple[list[list[int]], list[int], list[int]]:
    """(sequences, starts, ends) of example idx: tokens [start, end) of each sequence are what is scored."""
    prompts = render_prompts(task, idx)
    encoded = tokenizer(prompts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    tokens = [[bos, *ids] for ids in encoded]
    if task.kind == "multiple_choice":  # same context, different continuations
        starts, ends = [_common_length(tokens, False)] * len(tokens), [len(t) for t in tokens]
    elif task.kind == "schema":  # different contexts, same continuation
        suffix = _common_length(tokens, True)
        ends = [len(t) for t in tokens]
        starts = [e - suffix for e in ends]
    else:
        without, with_ = tokens
        if not (len(without) < len(with_) and with_[: len(without)] == without):
            raise UserError(
                f"task {task.label}: {task.path} line {task.lines[idx]}: the prompt without the continuation does "
                "not tokenize to a prefix of the prompt with it"
            )
        tokens, starts, ends = [with_], [len(without)], [len(with_)]
    if max_seq_len is not None:  # crop from the left, as nanochat does for models with a max_seq_len
        crops = [max(0, len(t) - max_seq_len) for t in tokens]
        tokens = [t[c:] for t, c in zip(tokens, crops)]
        starts, ends = [s - c for s, c in zip(starts, crops)], [e - c for e, c in zip(ends, crops)]
    return tokens, starts, ends


# ---------------------------------------------------------------- the model


def default_max_seq_len(model) -> int | None:
    """Sequences longer than this are cropped from the left: None (never) for nanochat's models (rotary, as
    nanochat's GPT, which has no max_seq_len), else the model's max_position_embeddings, if it has one."""
    config = getattr(model, "config", None)
    if config is None or config.model_type in NANOCHAT_MODEL_TYPES:
        return None
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


@torch.no_grad()
def score_examples(
    model,
    tokenizer,
    task: CoreTask,
    indices: list[int],
    batch_size: int = 32,
    max_seq_len: int | None = None,
    progress: Progress | None = None,
) -> list[ExampleScore]:
    """Score examples `indices` of `task`, several examples per forward (at most `batch_size` sequences, at least
    one example), right-padded with BOS: the causal model sees the same tokens as one example alone. Examples of
    similar length share a forward (less padding); the scores come back in the order of `indices`."""
    device = next(model.parameters()).device
    bos = bos_id(tokenizer)
    prepared = [example_tokens(task, i, tokenizer, bos, max_seq_len) for i in indices]
    order = sorted(range(len(indices)), key=lambda k: max(len(t) for t in prepared[k][0]))
    prepared, indices = [prepared[k] for k in order], [indices[k] for k in order]
    scores = []
    start = 0
    while start < len(prepared):
        stop, rows = start + 1, len(prepared[start][0])
        while stop < len(prepared) and rows + len(prepared[stop][0]) <= batch_size:
            rows += len(prepared[stop][0])
            stop += 1
        group = prepared[start:stop]
        seqs = [t for tokens, _, _ in group for t in tokens]
        width = max(len(t) for t in seqs)
        ids = torch.tensor([t + [bos] * (width - len(t)) for t in seqs], device=device)
        logits = model(input_ids=ids).logits
        # every scored position of the batch at once: the logits at position p predict the token at p + 1
        spans = [(s, e) for _, starts, ends in group for s, e in zip(starts, ends)]
        at_row = torch.tensor([r for r, (s, e) in enumerate(spans) for _ in range(s, e)], device=device)
        at_col = torch.tensor([p for s, e in spans for p in range(s, e)], device=device)
        out, target = logits[at_row, at_col - 1].float(), ids[at_row, at_col]
        token_losses = torch.nn.functional.cross_entropy(out, target, reduction="none")
        hits = (out.argmax(dim=-1) == target).tolist()
        offset = 0
        for k, (tokens, starts, ends) in enumerate(group):
            losses, matches = [], []
            for s, e in zip(starts, ends):
                losses.append(token_losses[offset : offset + e - s].mean().item())
                matches.append(all(hits[offset : offset + e - s]))
                offset += e - s
            item = task.rows[indices[start + k]]
            if task.kind == "language_modeling":
                scores.append(ExampleScore(int(matches[0]), matches[0], losses))
            else:
                pred = losses.index(min(losses))
                scores.append(ExampleScore(pred, pred == item["gold"], losses))
        if progress is not None:
            progress.update(stop - start)
        start = stop
    unsorted = [None] * len(scores)
    for k, score in zip(order, scores):
        unsorted[k] = score
    return unsorted


def evaluate_task(
    model,
    tokenizer,
    task: CoreTask,
    batch_size: int = 32,
    device: torch.device | str | None = None,
    max_seq_len: int | None = None,
    show_progress: bool = True,
) -> float:
    """Accuracy on `task`; under torch.distributed each rank scores every world_size-th example and the
    outcomes are all-reduced, so every rank returns the same number."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    device = torch.device(device) if device is not None else next(model.parameters()).device
    mine = list(range(rank, len(task.rows), world))
    desc = f"CORE {task.label}" + (f" (this rank's share of {len(task.rows)})" if world > 1 else "")
    with Progress(desc, len(mine), "examples", enabled=show_progress and rank == 0, announce=False) as progress:
        scores = score_examples(model, tokenizer, task, mine, batch_size, max_seq_len, progress)
    correct = torch.zeros(len(task.rows), dtype=torch.float32)
    for i, score in zip(mine, scores):
        correct[i] = float(score.correct)
    correct = correct.to(device)  # the collective's device (gloo: CPU, nccl: the GPU)
    if world > 1:
        dist.all_reduce(correct, op=dist.ReduceOp.SUM)
    return correct.mean().item()


def centered(accuracy: float, random_baseline: float) -> float:
    """Accuracy centered on the random baseline (percent): 0 = guessing, 1 = perfect."""
    return (accuracy - 0.01 * random_baseline) / (1.0 - 0.01 * random_baseline)


def evaluate_core(
    model,
    tokenizer,
    bundle_dir: str | Path | None = None,
    max_per_task: int = -1,
    batch_size: int = 32,
    device: torch.device | str | None = None,
    max_seq_len: int | None = -1,
    verbose: bool = True,
) -> dict:
    """CORE of `model` (any causal LM returning `.logits`, on its device) with its Hugging Face `tokenizer`.

    bundle_dir: the eval bundle (default $NANOCHAT_BASE_DIR/eval_bundle, downloaded once when missing).
    max_per_task: the first N rows of each task after the shuffle (-1: all). batch_size: sequences per forward.
    max_seq_len: crop longer sequences from the left (-1: `default_max_seq_len(model)`; None: never).
    verbose: a line per task on stdout (rank 0), as nanochat prints, and progress on stderr.
    Returns {"results": {label: accuracy}, "centered_results": {label: centered}, "core_metric": mean centered},
    the same on every rank. Under several processes the ranks run different numbers of forwards: the model's
    parameters must be whole on each rank (not FSDP2-sharded; a DDP wrapper's `.module` is fine).
    """
    tasks = load_bundle(ensure_bundle(bundle_dir), max_per_task)
    if max_seq_len == -1:
        max_seq_len = default_max_seq_len(model)
    main = not dist.is_initialized() or dist.get_rank() == 0
    was_training = model.training
    model.eval()
    results, centered_results = {}, {}
    try:
        for task in tasks:
            t0 = time.time()
            accuracy = evaluate_task(model, tokenizer, task, batch_size, device, max_seq_len, verbose)
            results[task.label] = accuracy
            centered_results[task.label] = centered(accuracy, task.random_baseline)
            if verbose and main:
                print(
                    f"Evaluating: {task.label} ({task.num_fewshot}-shot, type: {task.kind})... "
                    f"accuracy: {accuracy:.4f} | centered: {centered_results[task.label]:.4f} | "
                    f"time: {time.time() - t0:.2f}s",
                    flush=True,
                )
    finally:
        model.train(was_training)
    core_metric = sum(centered_results.values()) / len(centered_results)
    return {"results": results, "centered_results": centered_results, "core_metric": core_metric}
