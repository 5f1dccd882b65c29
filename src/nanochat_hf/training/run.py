"""Entry point of `accelerate launch scripts/mid_train.py [config.yaml] [--flag value ...]`.

`main` is the sequence setup -> build_trainer -> train -> finish; a script that needs another Trainer subclass
or extra callbacks composes the same steps.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import datasets
import torch
import torch.distributed as dist
import transformers

from ..atomic import remove_staging_leftovers
from ..data import DEMO_MIXTURE, load_mixture, read_mixture, tokenize_conversations
from ..data.bestfit import rows_cut_message
from ..errors import UserError, error_line, first_rank, one_line
from ..evaluation import results_table, run_chat_eval
from ..inference import format_parts, generate_reply
from ..jsonfile import read_json
from ..optim.precision import cpu_has_native_bfloat16, polar_dtype_name, resolve_polar_dtype
from ..tasks.spelling import simple_spelling
from ..tokenizer.chat_format import EOS_TOKEN
from .arguments import MidTrainingArguments, parse_args
from .callbacks import NonFiniteLossError
from .checkpoint.check import (
    check_fingerprint,
    data_format,
    load_fingerprint,
    model_config_fields,
    resolve_resume_checkpoint,
    run_fingerprint,
)
from .checkpoint.files import DiskFullError
from .checkpoint.layout import CHECKPOINT_RE, TRAINER_STATE_FILE, checkpoint_name
from .checkpoint.output_dir import prepare_output_dir, release_output_dir
from .evaluation import exact_match_accuracy
from .inherit import find_meta
from .model_source import load_model_and_tokenizer
from .report import write_report
from .trainer import MidTrainer

logger = logging.getLogger("nanochat_hf.mid_train")
PROG = "mid_train"  # the messages' prefix (base_run sets its own)


def _fail(error: BaseException | str, code: int = 2) -> None:
    """One line on stderr (from rank 0 only: every rank fails the same way), exit `code` on every rank."""
    if first_rank():
        print(error_line(PROG, error), file=sys.stderr, flush=True)
    sys.exit(code)


def _say(lines: list[str]) -> None:
    if first_rank():
        for line in lines:
            print(f"{PROG}: {line}", flush=True)


def on_main_process(args: MidTrainingArguments, fn: Callable[[], Any]) -> Any:
    """fn() on the main process only; every process gets its result, or its bad-input error as a UserError (so that
    all ranks stop with the same one line instead of the others waiting at the next collective)."""
    outcome: list = [None]
    if args.process_index == 0:
        try:
            outcome = [(True, fn())]
        except (UserError, OSError) as e:
            outcome = [(False, one_line(e))]
    if args.world_size > 1 and dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    ok, value = outcome[0]
    if not ok:
        raise UserError(value)
    return value


def prepare_output(args: MidTrainingArguments) -> None:
    """Before the model is built: output_dir checked (rank 0; writable, not another run's), and the checkpoint to
    resume from verified on every rank; `args.resume_from_checkpoint` becomes its path, or None."""
    if not args.dry_run:
        RUN["created_output_dir"] = not os.path.exists(args.output_dir)
        _say(
            on_main_process(
                args,
                lambda: prepare_output_dir(
                    args.output_dir, args.overwrite_output_dir, resuming=bool(args.resume_from_checkpoint)
                ),
            )
        )
    path, messages = resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)
    _say(messages)
    # never True: transformers would pick the newest checkpoint itself, unverified
    args.resume_from_checkpoint = str(path) if path else None
    if path:
        args.eval_on_start = False  # the evaluation at the resumed step was logged by the interrupted run


def check_resume(
    args: MidTrainingArguments,
    train_fingerprint: str | None,
    val_fingerprint: str | None,
    model_config: transformers.PretrainedConfig,
    tokenizer: transformers.PreTrainedTokenizerBase,
) -> dict:
    """This run's fingerprint (data stream, optimizer setup, model config, data format, code version), compared with
    the checkpoint's when resuming: UserError naming a changed field; a changed LR is applied (by `MidTrainer`)
    and said."""
    fingerprint = run_fingerprint(
        args,
        train_fingerprint,
        val_fingerprint,
        args.world_size,
        model_config_fields(model_config),
        data_format(tokenizer),
    )
    if args.resume_from_checkpoint:
        path = args.resume_from_checkpoint
        step = read_json(os.path.join(path, TRAINER_STATE_FILE))["global_step"]
        _say(check_fingerprint(load_fingerprint(path), fingerprint, step))
        _say([f"resuming from {path} (step {step})"])
    return fingerprint


def setup(argv: list[str] | None = None):
    """Everything that can fail on bad configuration, before any training: args, model, tokenizer, data."""
    args = parse_args(argv)
    RUN["args"] = args
    if args.train_mixture and not args.val_mixture:
        raise UserError(
            f"train_mixture={args.train_mixture} needs a val_mixture too (may be the same file when it "
            "has a `val:` split)"
        )
    check_compiler(args)
    polar_dtype_line(args)  # before any file is touched: a pinned bfloat16 the device cannot run stops here
    read_mixture(args.train_mixture, "train")  # validates the files without reading data: fail before the model
    read_mixture(args.val_mixture, "val")
    prepare_output(args)
    model, tokenizer = load_model_and_tokenizer(args)
    train = load_mixture(args.train_mixture, split="train")
    val = load_mixture(args.val_mixture, split="val")
    fingerprint = check_resume(args, train._fingerprint, val._fingerprint, model.config, tokenizer)
    # December mid-training trains on every token (nanochat ignores the assistant mask there); SFT at HEAD on the
    # assistant's completions only. Both render with nanochat's cut at 2048 tokens.
    with args.main_process_first(desc="tokenizing"):
        train_tokens = tokenize_conversations(
            train, tokenizer, max_tokens=2048, assistant_only=args.completion_only_loss
        )
        val_tokens = tokenize_conversations(val, tokenizer, max_tokens=2048, assistant_only=args.completion_only_loss)
    if args.packing == "bestfit":
        _say(
            [
                f"{name}: {line}"
                for name, tokens in (("train", train_tokens), ("val", val_tokens))
                if (line := rows_cut_message(tokens, args.max_seq_len))
            ]
        )
    return args, model, tokenizer, train_tokens, val_tokens, fingerprint


def check_compiler(args: MidTrainingArguments) -> None:
    """torch.compile on CPU builds C++ kernels at the first step; without a compiler inductor fails there with a
    long traceback. Asks torch's own compiler search ($CXX, else g++ / clang++) up front instead."""
    if not args.torch_compile or args.device.type != "cpu":
        return
    # imported here: torch._inductor takes about a second to import, and only runs that compile on CPU need it
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler:
        raise UserError(
            "torch_compile=true on CPU needs a C++ compiler and none was found (set $CXX or install "
            "g++ / clang++), or pass --torch_compile false to train eager"
        ) from None


def polar_dtype_line(args: MidTrainingArguments) -> str:
    """The run's line saying which dtype Muon orthogonalises in and why (`optim.precision`, which `build_optimizer`
    asks again with the same answer); UserError for a pinned bfloat16 the device cannot run."""
    dtype, reason = resolve_polar_dtype(args.polar_dtype, args.device, args.optimizer_recipe)
    name = polar_dtype_name(dtype)
    line = f"Muon orthogonalises in {name} (polar_dtype {args.polar_dtype}: {reason})"
    if args.optimizer_recipe == "2025-12" and name != "bfloat16":
        line += "; --polar_dtype bfloat16 gives nanochat's December numbers exactly"
    if name == "bfloat16" and args.device.type == "cpu" and not cpu_has_native_bfloat16()[0]:
        line += f"; slow here: {cpu_has_native_bfloat16()[1]} (emulated), --polar_dtype auto runs float32"
    return line


def build_trainer(
    args: MidTrainingArguments,
    model,
    tokenizer,
    train_tokens,
    val_tokens,
    fingerprint: dict | None = None,
    trainer_cls=None,
    callbacks: list | None = None,
):
    """The trainer, with the data stream built (fails fast when the mixture is too small for one step); then the
    lines saying what will run (Muon's dtype, CPU threads), once every argument, file and source has passed its
    checks."""
    if args.fully_shard:
        _ = args.device  # Accelerate's process group (set up on first use), which fully_shard shards across
        fully_shard_blocks(model)
    end_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    trainer = (trainer_cls or MidTrainer)(
        model=model,
        args=args,
        processing_class=tokenizer,
        train_dataset=train_tokens,
        eval_dataset=val_tokens,
        callbacks=callbacks,
        run_fingerprint=fingerprint,
    )
    meta = find_meta(args.model_source, args.model_tag, args.step, args.checkpoint_source)
    trainer.nanochat_meta = read_json(meta) if meta is not None else None
    trainer.get_train_dataloader()
    _say([polar_dtype_line(args), *args.settle_num_threads()])
    return trainer


def fully_shard_blocks(model: torch.nn.Module) -> None:
    """FSDP2 as Accelerate's TRANSFORMER_BASED_WRAP lays it out (what configs/accelerate_fsdp2.yaml gives on GPUs):
    `fully_shard` on every module of a class the model names in `_no_split_modules` (its decoder blocks), then on the
    root (embedding, head, norms). Every parameter becomes a DTensor sharded on dim 0 (Shard(0)), which nanochat's
    optimizer steps (optim/fsdp.py); the Trainer then wraps nothing in DDP (integration/mixin.py)."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(model._no_split_modules or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)


def train(trainer) -> float:
    """Train (resuming if asked), evaluate at the last step if the schedule did not; returns seconds."""
    RUN["trainer"] = trainer
    if trainer.args.torch_compile:
        _say(
            [
                (
                    "compiling the training step (torch.compile): the first step takes a minute or more on CPU, then "
                    "the steps run faster (--torch_compile false: eager)"
                )
            ]
        )
    t0 = time.time()
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)  # a verified path or None
    seconds = time.time() - t0
    if trainer.preempted_at is not None:
        preempted(trainer)
    evals = [h for h in trainer.state.log_history if "eval_val_bpb" in h]
    if not evals or evals[-1]["step"] != trainer.state.global_step:  # nanochat evaluates at the last step
        trainer.evaluate()
    return seconds


def spelling_conversations(n: int, demo: bool = True) -> list[dict]:
    """Held-out SimpleSpelling rows (test-split seeds 1000.., never in the train mixture): the demo mixture's
    `spelling_eval` rows (its small word list) for the demo, else the same seeds on the full word list."""
    words = DEMO_MIXTURE["spelling_eval"]["tasks"][0]["words"] if demo else "full"
    return [simple_spelling(1000 + i, "test", words) for i in range(n)]


def post_training_eval(trainer, metrics: dict, model: torch.nn.Module) -> str | None:
    """Rank 0: SimpleSpelling exact match into `metrics`, and a sample chat (returned), generated by ``model``
    (`MidTrainer.generation_model`)."""
    args, tokenizer = trainer.args, trainer.processing_class
    model.eval()
    with torch.no_grad():  # Accelerate's autocast is part of the prepared model's forward
        if args.spelling_eval_rows > 0:
            _say([f"SimpleSpelling exact match on {args.spelling_eval_rows} held-out rows (generation)"])
            metrics["spelling_exact_match"] = exact_match_accuracy(
                model, tokenizer, spelling_conversations(args.spelling_eval_rows, demo=args.val_mixture is None)
            )
        conv = {"messages": [{"role": "user", "content": args.sample_prompt}]}
        return format_parts(generate_reply(model, tokenizer, conv, max_new_tokens=64)["parts"])


def chat_eval(trainer, model: torch.nn.Module) -> None:
    """Every rank (each takes its share of the problems): nanochat's chat evaluation of ``model`` (the trained
    model, `MidTrainer.generation_model`) into `trainer.chat_eval_scores`, printed as a table on rank 0. Runs after
    the model is saved; a task whose data cannot be loaded is reported in one line and skipped (the run's model and
    report are kept)."""
    args = trainer.args
    for task in args.chat_eval_task_list:
        try:
            with torch.no_grad():
                trainer.chat_eval_scores += run_chat_eval(
                    model, trainer.processing_class, [task], args.chat_eval_max_problems, seed=args.seed
                )
        except (UserError, OSError) as e:  # e.g. a hub task while offline (a DataLoadError)
            _say([f"chat eval {task} skipped: {one_line(e).removeprefix(f'{task}: ')}"])
    if trainer.chat_eval_scores and first_rank():
        print(f"chat evaluation:\n{results_table(trainer.chat_eval_scores)}", flush=True)


def finish(trainer, train_time: float) -> dict:
    """Final metrics, post-training evaluation, model + card + report + trainer state, hub push, summary."""
    args = trainer.args
    metrics = {
        "steps": trainer.state.global_step,
        "tokens": trainer.state.global_step * args.total_batch_size,
        "val_bpb": next(h["eval_val_bpb"] for h in reversed(trainer.state.log_history) if "eval_val_bpb" in h),
        "min_val_bpb": trainer.min_val_bpb,
        "train_time_s": round(train_time, 1),
    }
    if not args.dry_run:
        _say([f"writing the model to {args.output_dir}"])
        trainer.save_model()  # final model + tokenizer (rank 0), atomic per file
        trainer.save_state()  # trainer_state.json: the whole log history
        RUN["model_saved"] = True
    # after the save: under FSDP2 this gathers a whole copy on every process (a collective), which must not cost
    # the trained model if it does not fit
    model = trainer.generation_model()
    sample = post_training_eval(trainer, metrics, model) if trainer.is_world_process_zero() else None
    chat_eval(trainer, model)
    if not args.dry_run:
        if trainer.is_world_process_zero():
            trainer.create_model_card()
            write_report(trainer, args.output_dir, metrics)
        if args.push_to_hub:
            trainer.push_to_hub(commit_message="End of training")
    if trainer.is_world_process_zero():
        print(f"validation bpb: {metrics['val_bpb']:.4f} (min {metrics['min_val_bpb']:.4f})")
        if "spelling_exact_match" in metrics:
            print(
                f"SimpleSpelling exact match: {metrics['spelling_exact_match']:.3f} "
                f"({args.spelling_eval_rows} held-out rows)"
            )
        print(f"sample chat:\n  user: {args.sample_prompt}\n  assistant: {sample}")
        if not args.dry_run:
            print(f"model written to {args.output_dir}")
    trainer.accelerator.wait_for_everyone()
    return metrics


# What an interruption (Ctrl-C) leaves behind depends on how far the run got: filled in as it goes.
RUN: dict[str, Any] = {}


def resume_command(argv: list[str]) -> list[str]:
    """The command line `argv` (sys.argv: the script, then its arguments) with --resume_from_checkpoint true."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--resume_from_checkpoint="):
            skip = False
            continue
        skip = arg == "--resume_from_checkpoint"
        if not skip:
            kept.append(arg)
    return ["python", *kept, "--resume_from_checkpoint", "true"]


def preempted(trainer) -> NoReturn:
    """Training stopped by a SIGTERM (`StepEndJITCheckpoint`): its checkpoint is saved; one line saying at which step
    and how to resume, exit 143 (128 + SIGTERM), and no final model (a half-trained model is not the result)."""
    step, args = trainer.preempted_at, trainer.args
    if first_rank():
        where = Path(args.output_dir) / checkpoint_name(step)
        print(
            f"{PROG}: preempted (SIGTERM) at step {step} of {trainer.state.max_steps}: {where} is saved, no final "
            f"model was written; resume, under the same launcher with any number of processes: "
            f"{shlex.join(resume_command(sys.argv))}",
            file=sys.stderr,
            flush=True,
        )
    sys.exit(143)


def quiet_libraries(main_process: bool) -> None:
    """Keep our lines and one bar: transformers' per-save "Writing model shards" bar (one shard, at every save) is
    dropped, other processes show no library bars or warnings (they would duplicate rank 0's), and transformers'
    notice that torch.compile's speed-ups need an Ampere GPU is not printed on CPU runs, which compile on purpose."""

    def hook(factory, args, kwargs):
        if not main_process or kwargs.get("desc") == "Writing model shards":
            kwargs = {**kwargs, "disable": True}
        return factory(*args, **kwargs)

    transformers.utils.logging.set_tqdm_hook(hook)
    if not main_process:  # rank 0 says it once (e.g. huggingface_hub's retries of an unreachable hub)
        datasets.disable_progress_bars()
        for name in ("huggingface_hub", "datasets"):
            logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("transformers.training_args").addFilter(_no_dynamo_gpu_notice)


def _no_dynamo_gpu_notice(record: logging.LogRecord) -> bool:
    return "speedups for torchdynamo" not in record.getMessage()


def interrupted() -> None:
    """Ctrl-C: one line saying what is left, and nothing half-made: the newest intact checkpoint to resume from, the
    saved model, or no output_dir at all when this run created it and wrote no checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the clean-up halfway
    args, trainer = RUN.get("args"), RUN.get("trainer")
    step = f" at step {trainer.state.global_step}" if trainer is not None else " before training started"
    if not first_rank():
        sys.exit(130)
    out = Path(args.output_dir) if args is not None and not args.dry_run else None
    if out is not None and out.is_dir():
        remove_staging_leftovers(out)  # a final save cut short
    if out is None:
        what = "nothing was written"
    elif RUN.get("model_saved"):
        what = f"the model is saved in {out}; report.md and the model card were not written"
    elif not out.is_dir():
        what = "nothing was written"
    else:
        try:
            path, _ = resolve_resume_checkpoint(out, True)
        except UserError:  # no intact checkpoint
            path = None
        if path is not None and (
            args.resume_from_checkpoint or (path / TRAINER_STATE_FILE).stat().st_mtime >= RUN["started"]
        ):
            what = f"{path} can be resumed with --resume_from_checkpoint true"
        else:  # none, or an earlier run's (kept there with --overwrite_output_dir)
            if RUN.get("created_output_dir"):
                shutil.rmtree(out, ignore_errors=True)
                what = f"no checkpoint had been written (--save_steps N writes them): removed {out}"
            else:
                partial = [
                    p
                    for p in out.iterdir()
                    if CHECKPOINT_RE.match(p.name) and p.is_dir() and p.stat().st_mtime >= RUN["started"]
                ]
                for p in partial:  # this run's incomplete checkpoint folders
                    shutil.rmtree(p, ignore_errors=True)
                what = f"no checkpoint of this run to resume; {out} is as it was"
    print(f"{PROG}: interrupted{step}: {what}", file=sys.stderr, flush=True)
    sys.exit(130)


def main(argv: list[str] | None = None) -> dict:
    """Parse, set up, train, evaluate, save, report, push."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    quiet_libraries(first_rank())
    RUN.clear()
    RUN["started"] = time.time()
    try:
        try:
            trainer = build_trainer(*setup(argv))
        except (UserError, OSError) as e:
            _fail(e)
        try:
            return finish(trainer, train(trainer))
        except (NonFiniteLossError, DiskFullError) as e:  # DiskFullError: a checkpoint or the final save
            _fail(e, code=1)
        except (UserError, OSError) as e:  # e.g. a resumed checkpoint's data state that does not match
            _fail(e)
    except KeyboardInterrupt:
        interrupted()
    finally:  # output_dir is free again (a refused run leaves no empty folder it made)
        release_output_dir()


if __name__ == "__main__":
    main()
