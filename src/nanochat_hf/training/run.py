"""Entry point of `accelerate launch scripts/mid_train.py [config.yaml] [--flag value ...]`.

`main` is the sequence setup -> build_trainer -> train -> finish; a script that needs another Trainer subclass
or extra callbacks composes the same steps.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from .arguments import MidTrainingArguments, parse_args
from .callbacks import NonFiniteLossError

logger = logging.getLogger("nanochat_hf.mid_train")


def _fail(message: str, code: int = 2) -> None:
    print(f"mid_train: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def setup(argv: list[str] | None = None):
    """Everything that can fail on bad configuration, before any training: args, model, tokenizer, data."""
    import nanochat_hf  # noqa: F401  (registers the Auto classes)
    from nanochat_hf.data import load_mixture, read_mixture, tokenize_conversations

    from .model_source import load_model_and_tokenizer

    args = parse_args(argv)
    if args.train_mixture and not args.val_mixture:
        raise ValueError(f"train_mixture={args.train_mixture} needs a val_mixture too (may be the same file when it "
                         "has a `val:` split)")
    read_mixture(args.train_mixture, "train")  # validates the files without reading data: fail before the model
    read_mixture(args.val_mixture, "val")
    model, tokenizer = load_model_and_tokenizer(args)
    train = load_mixture(args.train_mixture, split="train")
    val = load_mixture(args.val_mixture, split="val")
    # mid-training trains on every token (nanochat ignores the assistant mask here)
    with args.main_process_first(desc="tokenizing"):
        train_tokens = tokenize_conversations(train, tokenizer, max_tokens=2048, assistant_only=False)
        val_tokens = tokenize_conversations(val, tokenizer, max_tokens=2048, assistant_only=False)
    return args, model, tokenizer, train_tokens, val_tokens


def build_trainer(args: MidTrainingArguments, model, tokenizer, train_tokens, val_tokens, trainer_cls=None,
                  callbacks: list | None = None):
    """The trainer, with the data stream built (fails fast when the mixture is too small for one step)."""
    from .trainer import MidTrainer

    end_id = tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    trainer = (trainer_cls or MidTrainer)(
        model=model, args=args, processing_class=tokenizer, train_dataset=train_tokens, eval_dataset=val_tokens,
        callbacks=callbacks,
    )
    trainer.get_train_dataloader()
    return trainer


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint-<step> (trainer_state.json is written last) in output_dir."""
    done = [p for p in Path(output_dir).glob("checkpoint-*")
            if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()]
    return str(max(done, key=lambda p: int(p.name.split("-")[-1]))) if done else None


def resolve_resume(args: MidTrainingArguments) -> None:
    """resume_from_checkpoint true/last/latest -> the newest complete checkpoint (error when there is none)."""
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last", "latest"):
        args.resume_from_checkpoint = latest_checkpoint(args.output_dir)
        if args.resume_from_checkpoint is None:
            raise FileNotFoundError(f"resume_from_checkpoint: no complete checkpoint-<step> in {args.output_dir}")
    if args.resume_from_checkpoint:
        args.eval_on_start = False  # the evaluation at the resumed step was logged by the interrupted run


def train(trainer) -> float:
    """Train (resuming if asked), evaluate at the last step if the schedule did not; returns seconds."""
    t0 = time.time()
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint or None)
    seconds = time.time() - t0
    evals = [h for h in trainer.state.log_history if "eval_val_bpb" in h]
    if not evals or evals[-1]["step"] != trainer.state.global_step:  # nanochat evaluates at the last step
        trainer.evaluate()
    return seconds


def spelling_conversations(n: int, demo: bool = True) -> list[dict]:
    """Held-out SimpleSpelling rows (test-split seeds 1000.., never in the train mixture): the demo mixture's
    `spelling_eval` rows (its small word list) for the demo, else the same seeds on the full word list."""
    from nanochat_hf.data import DEMO_MIXTURE
    from nanochat_hf.data.synthetic import simple_spelling

    words = DEMO_MIXTURE["spelling_eval"]["tasks"][0]["words"] if demo else "full"
    return [simple_spelling(1000 + i, "test", words) for i in range(n)]


def post_training_eval(trainer, metrics: dict) -> str | None:
    """Rank 0: SimpleSpelling exact match into `metrics`, and a sample chat (returned)."""
    from nanochat_hf.inference import format_parts, generate_reply

    from .evaluation import exact_match_accuracy

    args, tokenizer = trainer.args, trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    with torch.no_grad():  # Accelerate's autocast is part of the prepared model's forward
        if args.spelling_eval_rows > 0:
            metrics["spelling_exact_match"] = exact_match_accuracy(
                model, tokenizer, spelling_conversations(args.spelling_eval_rows, demo=args.val_mixture is None))
        conv = {"messages": [{"role": "user", "content": args.sample_prompt}]}
        return format_parts(generate_reply(model, tokenizer, conv, max_new_tokens=64)["parts"])


def finish(trainer, train_time: float) -> dict:
    """Final metrics, post-training evaluation, model + card + report + trainer state, hub push, summary."""
    from .report import write_report

    args = trainer.args
    metrics = {
        "steps": trainer.state.global_step,
        "tokens": trainer.state.global_step * args.total_batch_size,
        "val_bpb": next(h["eval_val_bpb"] for h in reversed(trainer.state.log_history) if "eval_val_bpb" in h),
        "min_val_bpb": trainer.min_val_bpb,
        "train_time_s": round(train_time, 1),
    }
    sample = post_training_eval(trainer, metrics) if trainer.is_world_process_zero() else None
    if not args.dry_run:
        trainer.save_model()  # final model + tokenizer (rank 0), atomic per file
        trainer.save_state()  # trainer_state.json: the whole log history
        if trainer.is_world_process_zero():
            trainer.create_model_card()
            write_report(trainer, args.output_dir, metrics)
        if args.push_to_hub:
            trainer.push_to_hub(commit_message="End of training")
    if trainer.is_world_process_zero():
        print(f"validation bpb: {metrics['val_bpb']:.4f} (min {metrics['min_val_bpb']:.4f})")
        if "spelling_exact_match" in metrics:
            print(f"SimpleSpelling exact match: {metrics['spelling_exact_match']:.3f} "
                  f"({args.spelling_eval_rows} held-out rows)")
        print(f"sample chat:\n  user: {args.sample_prompt}\n  assistant: {sample}")
        if not args.dry_run:
            print(f"model written to {args.output_dir}")
    trainer.accelerator.wait_for_everyone()
    return metrics


def main(argv: list[str] | None = None) -> dict:
    """Parse, set up, train, evaluate, save, report, push."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        trainer = build_trainer(*setup(argv))
        resolve_resume(trainer.args)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    try:
        train_time = train(trainer)
    except NonFiniteLossError as e:
        _fail(str(e), code=1)
    return finish(trainer, train_time)


if __name__ == "__main__":
    main()
