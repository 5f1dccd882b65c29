"""base_train's trainer on the rows nanochat HEAD's base_train.py read (tests/training/data/base_train_*): HEAD's
flags, its initial weights, its train and validation rows, in-process. Shared by test_base_train.py and
data/make_base_train_reference.py (which asks HEAD to load the result)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from nanochat_hf.conversion.generations import hf_names
from nanochat_hf.model import NanoChatGPTForCausalLM
from nanochat_hf.training import run
from nanochat_hf.training.base import BaseTrainer, apply_plan, base_model_config, plan_run
from nanochat_hf.training.base_arguments import parse_base_args

DATA = Path(__file__).parent / "data"


def reference() -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((DATA / "base_train_reference.json").read_text()), load_file(
        DATA / "base_train_reference.safetensors"
    )


def flags(argv: list[str]) -> list[str]:
    """HEAD's --kebab-case=value flags as ours (--snake_case value), dropping those with no counterpart here."""
    out = []
    for arg in argv:
        name, value = arg[2:].split("=")
        if name not in ("device-type", "model-tag"):
            out += [f"--{name.replace('-', '_')}", value]
    return out


class ReplayStream:
    """`MicroBatchStream` of stored rows (N, B, T+1), from the first."""

    def __init__(self, rows: torch.Tensor):
        self.rows, self.i = rows, 0

    def read(self, count=None):
        while count is None or count > 0:
            row = self.rows[self.i]
            self.i += 1
            count = None if count is None else count - 1
            yield {"input_ids": row.clone(), "labels": row.clone()}

    def state_dict(self) -> dict:
        return {"pq_idx": 0, "rg_idx": self.i, "epoch": 1}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["rg_idx"]


class ReplayTrainer(BaseTrainer):
    def make_stream(self, split, rank=None, world_size=None):
        return ReplayStream(self.rows[split])


def train_replay(output_dir: str | Path, extra: list[str] = ()) -> ReplayTrainer:
    """Our base_train on HEAD's run: its flags (float32, eager), its initial weights, its rows; trained, then the
    final save as the script writes it (run.train evaluates at the last step, as HEAD)."""
    ref, tensors = reference()
    argv = [*flags(ref["argv"]), "--output_dir", str(output_dir), "--torch_compile", "false", "--dtype", "float32"]
    args = parse_base_args([*argv, "--overwrite_output_dir", "true", "--disable_tqdm", "true", *extra])
    tokenizer = AutoTokenizer.from_pretrained(DATA / "base_train_tokenizer")
    plan = plan_run(args, tokenizer, 1)
    apply_plan(args, plan)
    config = base_model_config(args, tokenizer)
    model = NanoChatGPTForCausalLM(config)
    names = hf_names(config)
    init = load_file(DATA / "base_train_init.safetensors")
    model.load_state_dict({names[k.removeprefix("init.")]: v for k, v in init.items()})
    trainer = ReplayTrainer(
        model=model, args=args, processing_class=tokenizer, plan=plan, token_bytes=tensors["token_bytes"]
    )
    trainer.rows = {"train": tensors["train_rows"], "val": tensors["val_rows"]}
    run.train(trainer)
    trainer.save_model()
    trainer.save_state()
    return trainer
