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
    rows = {"input_ids": [c for c, _ in conv], "labels": [[t if m else -100 for t, m in zip(c, k)] for c, k in conv],
            "num_tokens": [len(c) for c, _ in conv]}
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
