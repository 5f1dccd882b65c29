"""nanochat's chat evaluation: categorical and generative modes, several processes, ChatCORE, report, model card.

Categorical (multiple choice): one batched forward over the left-padded prompts; the prediction is the answer
letter with the highest logit at the last position, among the problem's letters only. Generative: batched,
left-padded `generate()` with the calculator tool (`CalculatorToolProcessor`), then the task's checker on the
whole decoded completion, tool blocks included, as nanochat's. Under ``accelerate launch`` each process takes
every world_size-th problem and the outcomes are gathered, so every process returns the same results.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from huggingface_hub import EvalResult

from ..atomic import write_text
from ..errors import UserError, one_line
from ..inference import decode_completion, generate_tokens
from ..progress import Progress
from ..tasks import EVAL_TASKS, SOURCE_ROW, DataLoadError, Problem, Task, load_rows, task_by_name
from ..tokenizer import render_for_completion

REPORT_HEADING = "## Chat evaluation"


@dataclass(frozen=True)
class TaskScore:
    task: str
    mode: str
    accuracy: float
    baseline: float
    n: int

    @property
    def centered(self) -> float:
        """Accuracy centered on the random baseline: 0 = guessing, 1 = perfect (nanochat's ChatCORE terms)."""
        return (self.accuracy - self.baseline) / (1.0 - self.baseline)


def chatcore(scores: list[TaskScore]) -> float | None:
    """ChatCORE: the mean over tasks of (accuracy - baseline) / (1 - baseline); None without tasks."""
    return sum(s.centered for s in scores) / len(scores) if scores else None


# ---------------------------------------------------------------- problems


def load_problems(
    task: Task, data_files: list[str] | None = None, max_problems: int | None = None, cache_dir: str | None = None
) -> list[Problem]:
    """The task's problems (`nanochat_hf.tasks`): hub rows shuffled with seed 42 right after loading, then the first
    `max_problems` (synthetic tasks: the first test seeds). DataLoadError: the data cannot be read."""
    if task.kind == "synthetic":
        n = task.eval_size if max_problems is None else min(max_problems, task.eval_size)
        return [task.problem(i) for i in range(n)]
    ds, source = load_rows(task, task.eval_split, task.name, data_files=data_files, cache_dir=cache_dir)
    if max_problems is not None:
        ds = ds.select(range(min(max_problems, len(ds))))
    problems = []
    for i, row in enumerate(ds.remove_columns(SOURCE_ROW)):
        try:
            problems.append(task.problem(row))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{task.name}: row {i} (after the seed-42 shuffle) of {source}: {e!r}") from None
    return problems


def load_eval_problems(
    tasks: list[str],
    data_files: dict[str, list[str]],
    max_problems: int | None,
    hub_off: str | None,
    skip_unavailable: Callable[[str, str], None],
) -> dict[str, list[Problem]]:
    """Each task's problems (`load_problems`), before a model is loaded: a task whose data cannot be loaded is left
    out after `skip_unavailable(task name, one-line reason)`, and when none can be, UserError in one line; where
    that is because the hub is off (`hub_off`: why, from `tasks.hub_off`), it names the datasets to download and
    how, or the local copies to give instead."""
    problems, failed = {}, {}
    for name in tasks:
        try:
            problems[name] = load_problems(EVAL_TASKS[name], data_files.get(name), max_problems)
        except DataLoadError as e:
            failed[name] = one_line(e)
    if not problems:
        hub = [n for n in failed if n not in data_files and EVAL_TASKS[n].kind == "hub"]
        if hub_off and hub == list(failed):
            names = ", ".join(f"{n} ({EVAL_TASKS[n].dataset})" for n in hub)
            raise UserError(
                f"{names}: not in the datasets cache, and {hub_off}: run it once where the hub is reachable (without "
                "HF_HUB_OFFLINE; the rows are then cached for offline runs), or give local copies with --data_files "
                "TASK=FILE"
            )
        raise UserError(f"no task could be loaded: {next(iter(failed.values()))}")
    for name, reason in failed.items():
        skip_unavailable(name, reason)
    return problems


# ---------------------------------------------------------------- the two modes


def _left_pad(prompts: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def _letter_ids(tokenizer, letters: str) -> list[int]:
    ids = [tokenizer.encode(letter, add_special_tokens=False) for letter in letters]
    if any(len(i) != 1 for i in ids):
        raise UserError(f"answer letters {letters!r} are not single tokens of this tokenizer")
    return [i[0] for i in ids]


@torch.no_grad()
def categorical_outcomes(model, tokenizer, problems: list[Problem], batch_size: int = 8) -> list[bool]:
    """Per problem: is the highest-logit answer letter (at the position after the prompt) the right one?"""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.bos_token_id
    outcomes = []
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        prompts = [render_for_completion(tokenizer, {"messages": p.messages}) for p in batch]
        ids, mask = _left_pad(prompts, pad, device)
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits[:, -1].float()
        for row, problem in zip(logits, batch):
            choice = row[_letter_ids(tokenizer, problem.letters)].argmax().item()
            outcomes.append(problem.letters[choice] == problem.answer)
    return outcomes


def generative_replies(
    model,
    tokenizer,
    problems: list[Problem],
    batch_size: int = 8,
    max_new_tokens: int = 512,
    temperature: float = 0.0,
    top_k: int | None = 50,
    seed: int | None = None,
) -> list[str]:
    """Per problem: the whole decoded completion, tool blocks included, as nanochat's chat_eval scores it."""
    replies = []
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        prompts = [render_for_completion(tokenizer, {"messages": p.messages}) for p in batch]
        for tokens in generate_tokens(
            model, tokenizer, prompts, max_new_tokens, temperature, top_k, None if seed is None else seed + start
        ):
            replies.append(decode_completion(tokenizer, tokens))
    return replies


# ---------------------------------------------------------------- one task, all tasks


def evaluate_task(
    model,
    tokenizer,
    task: Task,
    problems: list[Problem],
    batch_size: int = 8,
    max_new_tokens: int = 512,
    temperature: float = 0.0,
    top_k: int | None = 50,
    seed: int | None = None,
) -> TaskScore:
    """Score `problems` of `task`; under several processes each takes a strided share, outcomes are gathered.
    The main process shows its share's progress (`nanochat_hf.progress`)."""
    state = PartialState()
    mine = list(range(state.process_index, len(problems), state.num_processes))
    share = [problems[i] for i in mine]
    outcomes = []
    desc = f"chat eval {task.name}" + (f" (this process's share of {len(problems)})" if state.num_processes > 1 else "")
    with Progress(desc, len(share), "problems", enabled=state.is_main_process) as progress:
        for start in range(0, len(share), batch_size):  # the batches the two modes would make themselves
            batch = share[start : start + batch_size]
            if task.mode == "categorical":
                outcomes += categorical_outcomes(model, tokenizer, batch, batch_size)
            else:
                replies = generative_replies(
                    model,
                    tokenizer,
                    batch,
                    batch_size,
                    max_new_tokens,
                    temperature,
                    top_k,
                    None if seed is None else seed + start,
                )
                outcomes += [task.check(p, r) for p, r in zip(batch, replies)]
            progress.update(len(batch))
    pairs = list(zip(mine, outcomes))
    if state.num_processes > 1:
        pairs = gather_object(pairs)
    correct = sum(ok for _, ok in pairs)
    return TaskScore(task.name, task.mode, correct / len(problems) if problems else 0.0, task.baseline, len(problems))


def run_chat_eval(
    model,
    tokenizer,
    tasks: list[str] | None = None,
    max_problems: int | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 512,
    temperature: float = 0.0,
    top_k: int | None = 50,
    seed: int | None = None,
    data_files: dict[str, list[str]] | None = None,
    cache_dir: str | None = None,
    skip_unavailable: Callable[[str, str], None] | None = None,
    problems: dict[str, list[Problem]] | None = None,
) -> list[TaskScore]:
    """nanochat's chat evaluation of `model` (the bare causal LM, on its device) on `tasks` (default: all six).

    `data_files` maps a task name to local files in its hub layout (for offline runs). Returns one TaskScore
    per task, the same on every process; `chatcore(scores)` gives ChatCORE. A task whose data cannot be loaded
    (`DataLoadError`: offline, a damaged file) stops the evaluation, or, given `skip_unavailable`, is left out
    after calling `skip_unavailable(task name, one-line reason)`. `problems`: tasks' problems already loaded
    (`load_eval_problems`), used as they are.
    """
    names = list(EVAL_TASKS) if tasks is None else [task_by_name(t).name for t in tasks]
    files = {task_by_name(k).name: v for k, v in (data_files or {}).items()}
    was_training = model.training
    model.eval()
    try:
        scores = []
        for name in names:
            task = EVAL_TASKS[name]
            try:
                if problems is not None and name in problems:
                    loaded = problems[name]
                else:
                    loaded = load_problems(task, files.get(name), max_problems, cache_dir)
            except DataLoadError as e:
                if skip_unavailable is None:
                    raise
                skip_unavailable(name, one_line(e))
                continue
            scores.append(
                evaluate_task(model, tokenizer, task, loaded, batch_size, max_new_tokens, temperature, top_k, seed)
            )
        return scores
    finally:
        model.train(was_training)


# ---------------------------------------------------------------- results: table, report.md, model card


def results_table(scores: list[TaskScore]) -> str:
    """Markdown table (task, mode, accuracy, baseline, centered, n) and the ChatCORE line."""
    lines = ["| task | mode | accuracy | baseline | centered | n |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {s.task} | {s.mode} | {s.accuracy:.4f} | {s.baseline:.2f} | {s.centered:.4f} | {s.n} |" for s in scores
    ]
    core = chatcore(scores)
    if core is not None:
        partial = "" if len(scores) == len(EVAL_TASKS) else f" (over {len(scores)} of {len(EVAL_TASKS)} tasks)"
        lines += ["", f"ChatCORE{partial}: {core:.4f}"]
    return "\n".join(lines)


def report_section(scores: list[TaskScore]) -> str:
    return f"{REPORT_HEADING}\n\n{results_table(scores)}\n"


def write_report_section(path: str | os.PathLike, scores: list[TaskScore]) -> None:
    """Put the chat-evaluation section into `path` (report.md): replaces an earlier one, else appends; the rest
    of the file is kept. Written to a temporary file and renamed, so the report is never half-written."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    section = report_section(scores)
    pattern = re.compile(rf"^{re.escape(REPORT_HEADING)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + section
    write_text(path, text, mode=path.stat().st_mode & 0o7777 if path.exists() else None)  # keeps the report's mode


def model_index_results(scores: list[TaskScore]) -> list[EvalResult]:
    """`model-index` entries for the model card (``ModelCardData(eval_results=..., model_name=...)``)."""
    results = []
    for s in scores:
        task = EVAL_TASKS[s.task]
        results.append(
            EvalResult(
                task_type="text-generation",
                dataset_type=task.dataset or "nanochat-hf/spelling-bee",
                dataset_name=s.task,
                dataset_config=task.eval_config,
                dataset_split=task.eval_split,
                metric_type="accuracy",
                metric_name=f"{s.mode} accuracy ({s.n} problems)",
                metric_value=round(s.accuracy, 4),
            )
        )
    return results


def scores_as_dicts(scores: list[TaskScore]) -> list[dict]:
    return [{**asdict(s), "centered": s.centered} for s in scores]
