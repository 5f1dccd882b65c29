"""BOS-aligned best-fit packing (`BestFitStream`) against nanochat HEAD's loader and schedule, executed.

The reference (data/bestfit_reference.json) was made by data/make_bestfit_reference.py (see data/README.md): it
runs nanochat's own `sft_data_generator_bos_bestfit` and `get_lr_multiplier` from scripts/chat_sft.py at 92d63d4
over the synthetic conversations of `conversation` below, with its training loop's data and LR lines.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from nanochat_hf.data.bestfit import BestFitStream, rows_cut_message
from nanochat_hf.training.schedule import lr_multiplier

REFERENCE = json.loads((Path(__file__).parent / "data" / "bestfit_reference.json").read_text())
BOS = 1


def conversation(i: int, cap: int) -> tuple[list[int], list[int]]:
    """The reference's conversation i (make_bestfit_reference.py): BOS then tokens 10 + i, a loss-masked prompt."""
    length = 3 + (i * 37 + (i * i) % 17) % (cap - 3)
    prompt = 1 + (i * 11) % max(1, length - 1)
    return [BOS] + [10 + i] * (length - 1), [0] * prompt + [1] * (length - prompt)


def dataset(indices: range, cap: int, lengths: dict[int, int] | None = None) -> Dataset:
    ids, labels = [], []
    for i in indices:
        conv, mask = conversation(i, cap)
        if lengths and i - indices.start in lengths:  # a longer conversation (cut tests)
            conv = [BOS] + [10 + i] * (lengths[i - indices.start] - 1)
            mask = [0] + [1] * (len(conv) - 1)
        ids.append(conv)
        labels.append([t if m else -100 for t, m in zip(conv, mask)])
    return Dataset.from_dict({"input_ids": ids, "labels": labels, "num_tokens": [len(r) for r in ids]})


def nanochat_sha(batch: dict) -> str:
    """nanochat's (inputs, targets) of our micro-batch, hashed as the reference's (targets -1 where ignored)."""
    x = batch["input_ids"][:, :-1]
    y = batch["labels"][:, 1:].clone()
    y[y == -100] = -1
    return hashlib.sha256(x.to(torch.int64).numpy().tobytes() + y.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def streams(name: str, split: str = "train") -> list[BestFitStream]:
    c = REFERENCE[name]["config"]
    n, v = c["N"], c["V"]
    ds = dataset(range(n) if split == "train" else range(n, n + v), c["T"] + 1)
    return [BestFitStream(ds, c["T"], c["B"], bos_token_id=BOS, rank=r, world_size=c["W"]) for r in range(c["W"])]


@pytest.mark.parametrize("name", list(REFERENCE))
def test_rows_and_masks_equal_nanochat(name):
    """Every micro-batch of the run (train, all ranks) and of a validation pass: inputs and targets exactly."""
    ref = REFERENCE[name]
    for split, key in (("train", "train"), ("val", "val")):
        for rank, stream in enumerate(streams(name, split)):
            expected = ref[key][rank]
            got = [nanochat_sha(b) for b in stream.read(len(expected))]
            assert got == [e["sha"] for e in expected], f"{name} {split} rank {rank}"


@pytest.mark.parametrize("name", list(REFERENCE))
def test_steps_and_lr_multipliers_equal_nanochat(name):
    """The epoch's optimizer steps and every step's LR multiplier (rank 0's: ours are the same on every rank)."""
    ref, c = REFERENCE[name], REFERENCE[name]["config"]
    stream = streams(name)[0]
    assert stream.epoch_steps(c["G"]) == ref["steps"]
    got = [lr_multiplier(stream.lr_progress(s, c["G"]), warmdown_ratio=0.5) for s in range(ref["steps"])]
    assert got == [row[0] for row in ref["lrm"]]  # exact, negative last step included (as nanochat's)


def test_padding_is_bos_and_never_a_target():
    stream = streams("w1_g2")[0]
    for batch in stream.read(10):
        ids, labels = batch["input_ids"], batch["labels"]
        assert ids.shape == labels.shape == (4, 65)
        assert (ids[:, 0] == BOS).all()  # every row starts at a conversation
        assert ((labels == -100) | (labels == ids)).all()
        assert (labels[ids == BOS] == -100).all()


def test_resume_continues_the_same_rows():
    a = streams("w2_g1")[1]
    first = [nanochat_sha(b) for b in a.read(5)]
    state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint stores
    rest = [nanochat_sha(b) for b in a.read(7)]
    b = streams("w2_g1")[1]
    b.load_state_dict(state)
    assert [nanochat_sha(x) for x in b.read(7)] == rest
    assert first[0] == REFERENCE["w2_g1"]["train"][1][0]["sha"]


def test_resume_refuses_another_setup():
    state = streams("w2_g1")[0].state_dict()
    other = streams("w1_g2")[0]
    with pytest.raises(ValueError, match="max_seq_len|device_batch_size|world_size|conversations"):
        other.load_state_dict(state)


def test_conversation_longer_than_a_row_is_cut_and_counted():
    """nanochat would keep it in its buffer for good; ours cuts it to the row (as its renderer cuts at 2048)."""
    ds = dataset(range(40), 17, lengths={3: 30, 7: 17, 11: 18})
    stream = BestFitStream(ds, max_seq_len=16, device_batch_size=2, bos_token_id=BOS)
    assert rows_cut_message(ds, 16) == (
        "2 of 40 conversations are longer than a row of max_seq_len+1 = 17 tokens and "
        "are cut to it (first: row 3, 30 tokens)"
    )
    rows = np.concatenate([b["input_ids"].numpy() for b in stream.read(stream.num_micro_batches())])
    for token in (13, 17, 21):  # the cut ones and the one of exactly a row: BOS + 16 tokens, whole in a row
        per_row = (rows == token).sum(1)
        assert per_row.max() == 16 and set(per_row.tolist()) <= {0, 16}
    assert rows_cut_message(dataset(range(40), 17), 16) is None


def test_rejects_bad_input():
    ds = dataset(range(4), 17)
    with pytest.raises(ValueError, match="no column labels"):
        BestFitStream(ds.remove_columns("labels"), 16, 2, bos_token_id=BOS)
    with pytest.raises(ValueError, match="4 conversations for 8 processes"):
        BestFitStream(ds, 16, 2, bos_token_id=BOS, rank=0, world_size=8)
