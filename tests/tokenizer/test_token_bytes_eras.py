"""token_bytes.pt of both nanochat eras: tokenizer directories written by nanochat's own scripts/tok_train.py at
790f3be (each token's decoded string: a lone byte 0x80-0xFF counts 3) and at 92d63d4 (raw bytes since 2ce972a: it
counts 1), on the same corpus, so tokenizer.pkl is the same file (see data/README.md)."""

import json
import math
import pickle
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from nanochat_hf.tokenizer import (
    load_nanochat_tokenizer,
    save_nanochat_tokenizer,
    token_bytes,
    token_bytes_convention,
)
from nanochat_hf.training.evaluation import evaluate_bpb

DATA = Path(__file__).parent / "data"
ERAS = {"790f3be": "decoded", "92d63d4": "raw"}


def file_counts(commit: str) -> torch.Tensor:
    return torch.load(DATA / f"nanochat_{commit}" / "token_bytes.pt", weights_only=True)


def test_the_two_files_differ_on_the_bytes_that_are_not_utf8_alone():
    old, new = file_counts("790f3be"), file_counts("92d63d4")
    assert (DATA / "nanochat_790f3be" / "tokenizer.pkl").read_bytes() == (
        DATA / "nanochat_92d63d4" / "tokenizer.pkl"
    ).read_bytes()
    assert old[128:256].tolist() == [3] * 128 and new[128:256].tolist() == [1] * 128
    assert int((old != new).sum()) > 128  # and merged tokens that cut a character


@pytest.mark.parametrize("commit", ERAS)
def test_either_era_loads_and_keeps_the_files_counts(commit):
    tok = load_nanochat_tokenizer(DATA / f"nanochat_{commit}", trust_pickle=True)
    assert token_bytes_convention(tok) == ERAS[commit]
    assert torch.equal(token_bytes(tok), file_counts(commit).long())
    with open(DATA / f"nanochat_{commit}" / "tokenizer.pkl", "rb") as f:
        enc = pickle.load(f)
    text = "Unicode: 你好世界 🌍 naïve café, 1,234 pens."
    assert tok.encode(text, add_special_tokens=False) == enc.encode_ordinary(text)


@pytest.mark.parametrize("commit", ERAS)
def test_the_convention_that_came_in_is_written_back(commit, tmp_path):
    tok = load_nanochat_tokenizer(DATA / f"nanochat_{commit}", trust_pickle=True)
    pytest.importorskip("tiktoken")
    save_nanochat_tokenizer(tok, tmp_path / "direct")
    written = torch.load(tmp_path / "direct" / "token_bytes.pt", weights_only=True)
    assert written.dtype == torch.int32 and torch.equal(written, file_counts(commit))
    # through the Hugging Face format and a fresh load: the convention travels in tokenizer_config.json
    tok.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["token_bytes_convention"] == ERAS[commit]
    again = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert torch.equal(token_bytes(again), file_counts(commit).long())
    save_nanochat_tokenizer(again, tmp_path / "back")
    assert torch.equal(torch.load(tmp_path / "back" / "token_bytes.pt", weights_only=True), file_counts(commit))


class _LossIsIdMod7(torch.nn.Module):
    """Per-token loss (nats) = 1 + target id mod 7, so bits per byte can be worked out by hand."""

    def forward(self, input_ids, labels, loss_reduction):
        tgt = labels[:, 1:]
        return type("Out", (), {"loss": torch.where(tgt == -100, 0.0, 1.0 + tgt.float() % 7)})()


def test_bits_per_byte_uses_the_counts_of_the_checkpoints_nanochat():
    text = "日本語のテキスト 😀👍🏽 Straße Привет"
    bpb = {}
    for commit in ERAS:
        tok = load_nanochat_tokenizer(DATA / f"nanochat_{commit}", trust_pickle=True)
        ids = tok.encode(text)  # <|bos|> first
        labels = torch.tensor([ids])
        bpb[commit] = evaluate_bpb(_LossIsIdMod7(), [{"input_ids": labels, "labels": labels}], token_bytes(tok), "cpu")
        counts = file_counts(commit)  # nanochat's bpb: nats of targets with bytes / (ln 2 * their bytes)
        nats = sum(1 + t % 7 for t in ids[1:] if counts[t] > 0)
        assert bpb[commit] == pytest.approx(nats / (math.log(2) * sum(int(counts[t]) for t in ids[1:])), rel=1e-6)
    assert bpb["790f3be"] != pytest.approx(bpb["92d63d4"], rel=1e-3)


def _copy(tmp_path: Path, counts: torch.Tensor) -> Path:
    d = tmp_path / "tokenizer"
    d.mkdir()
    (d / "tokenizer.pkl").write_bytes((DATA / "nanochat_92d63d4" / "tokenizer.pkl").read_bytes())
    torch.save(counts, d / "token_bytes.pt")
    return d


def test_a_file_that_follows_neither_is_refused_in_one_line(tmp_path):
    counts = file_counts("92d63d4").clone()
    counts[200] = 2
    with pytest.raises(ValueError) as e:
        load_nanochat_tokenizer(_copy(tmp_path, counts), trust_pickle=True)
    assert str(e.value).endswith(
        "token_bytes.pt: token 200 counts 2 bytes, which follows neither of nanochat's "
        "conventions: its raw bytes are 1 (nanochat since 2ce972a), its decoded string has "
        "3 UTF-8 bytes (before)"
    )
    assert "\n" not in str(e.value)


def test_a_file_that_mixes_the_two_is_refused(tmp_path):
    counts = file_counts("92d63d4").clone()
    counts[130] = 3  # one token counted the old way
    with pytest.raises(ValueError, match="token 130 counts 3 bytes, which follows neither"):
        load_nanochat_tokenizer(_copy(tmp_path, counts), trust_pickle=True)


@pytest.mark.parametrize(
    "counts, message",
    [
        (
            torch.zeros(399, dtype=torch.int32),
            (
                r"expected an integer tensor of shape \(400,\) for the vocab, got "
                r"torch.int32 tensor of shape \(399,\)"
            ),
        ),
        (torch.zeros(400), r"got torch.float32 tensor of shape \(400,\)"),
        ([1, 2], "got list"),
    ],
)
def test_a_file_of_the_wrong_shape_is_refused(tmp_path, counts, message):
    with pytest.raises(ValueError, match=message):
        load_nanochat_tokenizer(_copy(tmp_path, counts), trust_pickle=True)
