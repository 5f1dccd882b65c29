"""Entry point of `accelerate launch scripts/base_train.py [config.yaml] [--flag value ...]`: mid_train's steps
(run.py: output folder, resume checks, training, SIGTERM, Ctrl-C) around `BaseTrainer`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import datasets
import torch
from transformers import AutoTokenizer

from ..data.pretraining import (
    DATA_SUBDIR,
    find_shards,
    shards_fingerprint,
    split_shards,
    tokenizer_fingerprint,
    write_synthetic_shards,
)
from ..errors import UserError, first_rank, one_line
from ..model import NanoChatGPTForCausalLM
from ..paths import nanochat_base_dir
from ..tokenizer import train_tokenizer
from ..tokenizer.chat_format import BOS
from ..tokenizer.nanochat_format import load_nanochat_tokenizer
from . import run
from .base import BaseTrainer, apply_plan, base_model_config, plan_run, user_config
from .base_arguments import PROG, BaseTrainingArguments, parse_base_args
from .callbacks import NonFiniteLossError
from .checkpoint.files import DiskFullError
from .checkpoint.output_dir import release_output_dir
from .fp8 import convert_to_fp8

DEMO_SHARDS, DEMO_DOCS, DEMO_ROW_GROUP = 3, 3000, 250  # the demo's synthetic shards


def tokenizer_dir(args: BaseTrainingArguments) -> Path:
    return Path(args.tokenizer_dir).expanduser() if args.tokenizer_dir else nanochat_base_dir() / "tokenizer"


def make_demo_data(args: BaseTrainingArguments) -> list[str]:
    """demo_data: synthetic shards into data_dir and a tokenizer trained on their train split into tokenizer_dir,
    each unless already there (rank 0; the others wait)."""
    data_dir = Path(args.data_dir or nanochat_base_dir() / DATA_SUBDIR).expanduser()
    with args.main_process_first(desc="demo data"):
        if not list(data_dir.glob("shard_*.parquet")):
            run._say([f"writing {DEMO_SHARDS} synthetic shards into {data_dir} (demo_data)"])
            write_synthetic_shards(data_dir, DEMO_SHARDS, DEMO_DOCS, row_group_size=DEMO_ROW_GROUP)
        folder = tokenizer_dir(args)
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.pkl").is_file():
            run._say([f"training a {args.demo_vocab_size}-token tokenizer on them into {folder} (demo_data)"])
            shards = split_shards(find_shards(data_dir), "train")
            texts = datasets.load_dataset("parquet", data_files=shards, split="train")["text"]
            train_tokenizer(texts, args.demo_vocab_size).save_pretrained(folder)
    args.data_dir = str(data_dir)


def load_tokenizer(args: BaseTrainingArguments):
    """The tokenizer of tokenizer_dir: Hugging Face files, else HEAD's tokenizer.pkl (with trust_pickle); it must
    have nanochat's BOS, which starts every document."""
    folder = tokenizer_dir(args)
    if (folder / "tokenizer.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
        except Exception as e:  # noqa: BLE001 -- tokenizers raises plain Exception on a damaged tokenizer.json
            raise UserError(f"{folder / 'tokenizer.json'}: cannot be loaded ({one_line(e)})") from None
    elif (folder / "tokenizer.pkl").is_file():
        tokenizer = load_nanochat_tokenizer(folder, trust_pickle=args.trust_pickle)
    else:
        raise UserError(
            f"{folder}: no tokenizer (tokenizer.json, or HEAD's tokenizer.pkl from its tok_train.py): pass "
            "--tokenizer_dir, or set NANOCHAT_BASE_DIR"
        )
    if BOS not in tokenizer.get_vocab():
        raise UserError(f"{folder}: the tokenizer has no {BOS} token, which nanochat puts before every document")
    tokenizer.bos_token = BOS
    return tokenizer


def setup(argv: list[str] | None = None):
    """Everything that can fail on bad input, before any training: arguments, data, tokenizer, the run's plan."""
    args = parse_base_args(argv)
    run.RUN["args"] = args
    run.check_compiler(args)
    run.polar_dtype_line(args)
    if args.demo_data:
        make_demo_data(args)
    shards = find_shards(args.data_dir)
    train_fp, val_fp = (shards_fingerprint(split_shards(shards, s)) for s in ("train", "val"))
    tokenizer = load_tokenizer(args)
    given = user_config(args)  # as given, before HEAD's rules fill in the derived values
    plan = plan_run(args, tokenizer, args.world_size)
    apply_plan(args, plan)
    run.prepare_output(args)
    config = base_model_config(args, tokenizer)
    torch.manual_seed(args.seed)
    model = NanoChatGPTForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    fingerprint = run.check_resume(args, train_fp, val_fp + tokenizer_fingerprint(tokenizer), config, tokenizer)
    return args, model, tokenizer, plan, given, fingerprint


def build_trainer(args, model, tokenizer, plan, given, fingerprint) -> BaseTrainer:
    # --fp8 (the arguments checked the device): HEAD's layers become float8 ones before the Trainer compiles the model
    fp8_line = [convert_to_fp8(model, args.fp8_recipe)] if args.fp8 else []
    trainer = BaseTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        plan=plan,
        user_config=given,
        run_fingerprint=fingerprint,
    )
    trainer.get_train_dataloader()
    run._say([*plan.lines, *fp8_line, run.polar_dtype_line(args), *args.settle_num_threads()])
    return trainer


def finish(trainer: BaseTrainer, seconds: float) -> dict:
    """The final model (an ordinary Hugging Face folder, with base_train's meta for to-nanochat), the log history,
    the hub push, a summary."""
    args = trainer.args
    val = [h["eval_val_bpb"] for h in trainer.state.log_history if "eval_val_bpb" in h]
    metrics = {
        "steps": trainer.state.global_step,
        "tokens": trainer.state.global_step * args.total_batch_size,
        "val_bpb": val[-1] if val else None,
        "min_val_bpb": trainer.min_val_bpb,
        "train_time_s": round(seconds, 1),
    }
    if not args.dry_run:
        run._say([f"writing the model to {args.output_dir}"])
        trainer.save_model()
        trainer.save_state()
        run.RUN["model_saved"] = True
        if args.push_to_hub:
            trainer.push_to_hub(commit_message="End of training")
    if trainer.is_world_process_zero():
        if val:
            print(f"validation bpb: {val[-1]:.6f} (min {trainer.min_val_bpb:.6f})")
        if not args.dry_run:
            print(f"model written to {args.output_dir}")
    trainer.accelerator.wait_for_everyone()
    return metrics


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    mid_train, run.PROG = run.PROG, PROG  # run.py's messages name this script (restored: one process may run both)
    run.quiet_libraries(first_rank())
    run.RUN.clear()
    run.RUN["started"] = time.time()
    try:
        try:
            trainer = build_trainer(*setup(argv))
        except (UserError, OSError) as e:
            run._fail(e)
        try:
            return finish(trainer, run.train(trainer))
        except (NonFiniteLossError, DiskFullError) as e:
            run._fail(e, code=1)
        except (UserError, OSError) as e:
            run._fail(e)
    except KeyboardInterrupt:
        run.interrupted()
    finally:
        release_output_dir()
        run.PROG = mid_train
