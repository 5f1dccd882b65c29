"""Entry point of `accelerate launch scripts/mid_train.py [config.yaml] [--flag value ...]`."""

from __future__ import annotations

import logging
import sys
import time

import torch

from .arguments import parse_args

logger = logging.getLogger("nanochat_hf.mid_train")


def _fail(message: str) -> None:
    print(f"mid_train: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


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


def spelling_conversations(n: int, demo: bool = True) -> list[dict]:
    """Held-out SimpleSpelling rows (test-split seeds 1000.., never in the train mixture): the demo mixture's
    `spelling_eval` rows (its small word list) for the demo, else the same seeds on the full word list."""
    from nanochat_hf.data import DEMO_MIXTURE
    from nanochat_hf.data.synthetic import simple_spelling

    words = DEMO_MIXTURE["spelling_eval"]["tasks"][0]["words"] if demo else "full"
    return [simple_spelling(1000 + i, "test", words) for i in range(n)]


def main(argv: list[str] | None = None, trainer_cls=None, callbacks: list | None = None) -> dict:
    """Parse, set up, train, evaluate, save, report, push. `trainer_cls`/`callbacks` let tests instrument it."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        args, model, tokenizer, train_tokens, val_tokens = setup(argv)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    from nanochat_hf.inference import format_parts, generate_reply

    from .evaluation import exact_match_accuracy
    from .report import write_report
    from .trainer import MidTrainer

    end_id = tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    try:
        trainer = (trainer_cls or MidTrainer)(
            model=model, args=args, processing_class=tokenizer, train_dataset=train_tokens, eval_dataset=val_tokens,
            callbacks=callbacks,
        )
        trainer.get_train_dataloader()  # fails fast (mixture too small) before training starts
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last", "latest"):
        resume = True  # the latest checkpoint-<step> in output_dir
    if resume:
        args.eval_on_start = False  # the evaluation at the resumed step was logged by the interrupted run
    t0 = time.time()
    trainer.train(resume_from_checkpoint=resume)
    train_time = time.time() - t0
    last = [h for h in trainer.state.log_history if "eval_val_bpb" in h]
    if not last or last[-1]["step"] != trainer.state.global_step:  # eval_every <= 0: evaluate once at the end
        trainer.evaluate()

    metrics = {
        "steps": trainer.state.global_step,
        "tokens": trainer.state.global_step * args.total_batch_size,
        "val_bpb": next(h["eval_val_bpb"] for h in reversed(trainer.state.log_history) if "eval_val_bpb" in h),
        "min_val_bpb": trainer.min_val_bpb,
        "train_time_s": round(train_time, 1),
    }
    sample = None
    if trainer.is_world_process_zero():
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        unwrapped.eval()
        with torch.no_grad():  # Accelerate's autocast is part of the prepared model's forward
            if args.spelling_eval_rows > 0:
                metrics["spelling_exact_match"] = exact_match_accuracy(
                    unwrapped, tokenizer, spelling_conversations(args.spelling_eval_rows, demo=args.val_mixture is None)
                )
            conv = {"messages": [{"role": "user", "content": args.sample_prompt}]}
            sample = format_parts(generate_reply(unwrapped, tokenizer, conv, max_new_tokens=64)["parts"])
    if not args.dry_run:
        trainer.save_model()  # final model + tokenizer (rank 0), atomic per file
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


if __name__ == "__main__":
    main()
