"""`accelerate launch scripts/chat_rl.py [config.yaml] [--flag value ...]`: setup -> train -> final save + report."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import UserError, run_cli
from .arguments import PROG, RLArguments, parse_args

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def gsm8k_rows(args: RLArguments, split: str) -> list[dict]:
    """{prompt: [the user message], answer: the reference final number} per GSM8K problem, in nanochat's order
    (hub and files: shuffled with seed 42, as nanochat's GSM8K task)."""
    from ..tasks.demo import arithmetic_row
    from ..tasks.gsm8k import TASK, problem
    from ..tasks.hub import DataLoadError, load_rows

    if args.gsm8k_source == "demo":
        n = args.demo_rows if split == "train" else max(args.eval_examples, 1)
        raw = [arithmetic_row(i + (1000 if split == "train" else 0), split) for i in range(n)]
    else:
        files = args.train_data_files if split == "train" else args.eval_data_files
        try:
            raw, _ = load_rows(
                TASK, split, f"GSM8K[{split}]", data_files=files if args.gsm8k_source == "files" else None
            )
        except DataLoadError as e:  # its hint names mid_train's data_files: ours are these
            raise UserError(f"{e} (here: gsm8k_source files, train_data_files, eval_data_files)") from None
    rows = []
    for i, row in enumerate(raw):
        try:
            p = problem(row)
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"GSM8K {split} row {i}: {e} (expected openai/gsm8k's question / answer)") from None
        rows.append({"prompt": p.messages, "answer": p.answer})
    return rows


def load_model(args: RLArguments):
    """(model, tokenizer) as mid_train's model_source reads them (a nanochat dir converted on the fly)."""
    from ..training.model_source import load_model_and_tokenizer, load_pretrained

    path = Path(args.model_source).expanduser()
    if path.is_dir() and (path / "config.json").is_file() or not path.exists():
        return load_pretrained(args.model_source, flag="--model_source")
    source = SimpleNamespace(
        model_source=args.model_source,
        model_tag=args.model_tag,
        step=args.model_step,
        checkpoint_source=args.checkpoint_source,
        tokenizer_dir=args.tokenizer_dir,
        trust_pickle=args.trust_pickle,
        max_seq_len=0,
    )
    return load_model_and_tokenizer(source)


def resolve_checkpoint(output_dir: str, value: str | None) -> str | None:
    """The checkpoint to resume from: `value` if it is a complete checkpoint folder, or with 'last' the newest
    complete checkpoint-<step> in output_dir (one interrupted while it was written is skipped); else UserError."""
    from ..training.checkpoint.layout import OPTIMIZER_FILE, SCHEDULER_FILE

    needed = ("trainer_state.json", "model.safetensors", SCHEDULER_FILE, OPTIMIZER_FILE.format(rank=0))

    def complete(p: Path) -> bool:
        return all((p / f).is_file() for f in needed)

    if value in (None, ""):
        return None
    if value.lower() not in ("last", "true"):
        if not complete(Path(value)):
            raise UserError(
                f"resume_from_checkpoint={value}: not a complete checkpoint folder (needs {', '.join(needed)})"
            )
        return value
    found = sorted(
        (int(m.group(1)), p)
        for p in Path(output_dir).glob("checkpoint-*")
        if (m := CHECKPOINT.match(p.name)) and complete(p)
    )
    if not found:
        raise UserError(f"resume_from_checkpoint=last: no complete checkpoint-<step> folder in {output_dir}")
    return str(found[-1][1])


def after_interrupt(args: RLArguments) -> str:
    """What Ctrl-C leaves to do: resume from the newest complete checkpoint in output_dir, or, with none, start
    again (the resume would refuse)."""
    try:
        last = resolve_checkpoint(args.output_dir, "last")
    except UserError:
        every = f"every {args.save_every} steps" if args.save_every > 0 else "never: save_every is off"
        return f"no checkpoint was written (they are written {every}): nothing to resume, run it again to start over"
    return f"resume with --resume_from_checkpoint last ({last}, the newest complete checkpoint)"


def require_trl() -> None:
    """UserError in one line naming the install command when TRL, which the RL stage runs on, is not installed
    (`pip install -e .` leaves it out: it comes with the rl extra)."""
    try:
        import trl  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "trl":  # TRL is there but something it needs is not: its own error says what
            raise
        raise UserError(
            "No module named 'trl': the RL stage runs on TRL's GRPOTrainer; install the rl extra: "
            'pip install -e ".[rl]" (from the repository root)'
        ) from None


def build_trainer(args: RLArguments, model: Any, tokenizer: Any, world_size: int = 1):
    from datasets import Dataset

    from .rewards import gsm8k_reward
    from .rollout import NanoChatRollout, check_prompt_format
    from .trainer import NanoChatGRPOTrainer

    check_prompt_format(tokenizer, args.model_source)
    rollout = NanoChatRollout(
        tokenizer,
        args.device_batch_size,
        args.max_new_tokens,
        args.temperature,
        args.top_k or None,
        args.calculator,
        max_sequence_len=getattr(model.config, "sequence_len", None) or model.config.max_position_embeddings,
    )
    train = gsm8k_rows(args, "train")
    for row in train:  # every prompt fits the context, checked before any step (one line naming it otherwise)
        rollout.prompt_ids(row["prompt"])
    return NanoChatGRPOTrainer(
        model=model,
        args=args.grpo_config(len(train), world_size),
        train_dataset=Dataset.from_list(train),
        processing_class=tokenizer,
        rollout=rollout,
        reward_funcs=gsm8k_reward(tokenizer),
        eval_rows=gsm8k_rows(args, "test") if args.eval_every > 0 else None,
        eval_every=args.eval_every,
        eval_examples=args.eval_examples,
        nanochat_optimizer=args.optimizer_settings(),
        muon_momentum_warmup=False,  # chat_rl.py: momentum 0.95 from the first step
    )


def train(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's experimental API; we pin TRL
    args = parse_args(argv)
    require_trl()
    model, tokenizer = load_model(args)
    resume = resolve_checkpoint(args.output_dir, args.resume_from_checkpoint)
    trainer = build_trainer(args, model, tokenizer, int(os.environ.get("WORLD_SIZE", "1")))
    if trainer.args.device.type == "cpu":  # as mid_train: the cores idle now, and the line saying so
        from ..training.device import use_cpu_threads

        line = use_cpu_threads(args.num_threads, trainer.accelerator.num_processes)
        if trainer.is_world_process_zero():
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)
    try:
        trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:  # the checkpoints written so far stay as they are; one being written is skipped
        if trainer.is_world_process_zero():
            print(
                f"{PROG}: interrupted at step {trainer.state.global_step}; {after_interrupt(args)}",
                file=sys.stderr,
                flush=True,
            )
        return 130
    trainer.save_model(args.output_dir)  # the last step's model, as chat_rl.py's last save (and its tokenizer)
    trainer.save_state()  # trainer_state.json beside it: the whole log history (rewards, pass@k)
    if trainer.is_world_process_zero():
        from .report import write_rl_report

        print(f"{PROG}: final model and report in {write_rl_report(trainer, args).parent}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: train(argv))
