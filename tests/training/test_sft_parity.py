"""Our SFT rows, loss and val bpb against nanochat's code executed on the same weights and rows.

Reference: data/sft_parity_reference.json, made by data/make_sft_parity_reference.py (see data/README.md):
nanochat's December GPT on rows of nanochat HEAD's best-fit SFT loader, HEAD's evaluate_bpb.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from nanochat_hf.data import BestFitStream
from nanochat_hf.model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.training.evaluation import evaluate_bpb

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "sft_parity_reference.json").read_text())
_spec = importlib.util.spec_from_file_location("make_sft_parity_reference", DATA / "make_sft_parity_reference.py")
ref = importlib.util.module_from_spec(_spec)  # its formulas: conversation, weights, token_bytes (nanochat not needed)
_spec.loader.exec_module(ref)


@pytest.fixture(scope="module")
def setup():
    conv = [ref.conversation(i) for i in range(REFERENCE["N"] + REFERENCE["V"])]
    rows = {
        "input_ids": [c for c, _ in conv],
        "labels": [[t if m else -100 for t, m in zip(c, k)] for c, k in conv],
        "num_tokens": [len(c) for c, _ in conv],
    }
    ds = Dataset.from_dict(rows)
    train, val = ds.select(range(REFERENCE["N"])), ds.select(range(REFERENCE["N"], len(ds)))
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**REFERENCE["config"]))
    with torch.no_grad():
        ref.weights(model.state_dict())
    return train, val, model.eval()


def test_epoch_losses_equal_nanochat(setup):
    train, _, model = setup
    stream = BestFitStream(train, REFERENCE["T"], REFERENCE["B"], bos_token_id=ref.BOS)
    assert stream.epoch_steps(1) == len(REFERENCE["losses"])
    with torch.no_grad():
        ours = [model(**batch).loss.item() for batch in stream.read(len(REFERENCE["losses"]))]
    assert ours == pytest.approx(REFERENCE["losses"], rel=1e-5)


def test_val_bpb_equals_nanochat(setup):
    _, val, model = setup
    stream = BestFitStream(val, REFERENCE["T"], REFERENCE["B"], bos_token_id=ref.BOS)
    bpb = evaluate_bpb(model, stream.read(REFERENCE["eval_steps"]), ref.token_bytes(), "cpu")
    assert bpb == pytest.approx(REFERENCE["val_bpb"], rel=1e-5)


TRAJECTORY = json.loads((DATA / "sft_trajectory_reference.json").read_text())


def test_epoch_trajectory_equals_nanochat_chat_sft(setup, tmp_path):
    """One SFT epoch through our Trainer with optimizer_recipe 2026-07: every step's logged loss and LR multiplier
    and the val bpb at steps 0 and last equal nanochat's chat_sft.py loop executing with its MuonAdamW
    (data/make_sft_trajectory_reference.py)."""
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.training.arguments import parse_args
    from nanochat_hf.training.trainer import MidTrainer

    class Trainer(MidTrainer):
        def make_stream(self, token_ds):
            return BestFitStream(token_ds, self.args.max_seq_len, self.args.device_batch_size, bos_token_id=ref.BOS)

    train, val, _ = setup
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**REFERENCE["config"]))
    with torch.no_grad():
        ref.weights(model.state_dict())
    B, T = REFERENCE["B"], REFERENCE["T"]
    lr = TRAJECTORY["lr"]
    args = parse_args(
        [
            "--model_source",
            "demo",
            "--max_seq_len",
            str(T),
            "--device_batch_size",
            str(B),
            "--total_batch_size",
            str(B * T),
            "--num_iterations",
            "-1",
            "--packing",
            "bestfit",
            "--init_lr_frac",
            str(TRAJECTORY["init_lr_frac"]),
            "--warmdown_ratio",
            str(TRAJECTORY["warmdown_ratio"]),
            "--embedding_lr",
            str(lr["embedding_lr"]),
            "--unembedding_lr",
            str(lr["unembedding_lr"]),
            "--matrix_lr",
            str(lr["matrix_lr"]),
            "--weight_decay",
            "0",
            "--optimizer_recipe",
            "2026-07",
            "--eval_every",
            "-1",
            "--eval_tokens",
            str(REFERENCE["eval_steps"] * B * T),
            "--torch_compile",
            "false",
            "--dtype",
            "float32",
            "--dry_run",
            "true",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    trainer = Trainer(
        model=model,
        args=args,
        processing_class=demo_tokenizer(),
        train_dataset=train,
        eval_dataset=val,
        token_bytes=ref.token_bytes(),
    )
    bpb0 = trainer.evaluate()["eval_val_bpb"]
    trainer.train()
    bpb1 = trainer.evaluate()["eval_val_bpb"]
    logged = [h for h in trainer.state.log_history if "lrm" in h]
    expected = TRAJECTORY["steps"]
    assert [h["step"] for h in logged] == [s["step"] for s in expected]
    assert [h["lrm"] for h in logged] == pytest.approx([s["lrm"] for s in expected], rel=1e-9, abs=1e-12)
    assert [h["loss"] for h in logged] == pytest.approx([s["loss"] for s in expected], rel=1e-3)
    assert [bpb0, bpb1] == pytest.approx(list(TRAJECTORY["val_bpb"].values()), rel=1e-3)
