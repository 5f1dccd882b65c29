"""Tokenization (datasets.map, cached) and packing into nanochat's micro-batches per rank."""

import json

import pytest
import torch

import nanochat_hf.tokenizer as tokenizer_mod
from nanochat_hf.data import PackedStream, load_mixture, loads, tokenize_conversations
from nanochat_hf.tokenizer import render_conversation

T, B = 16, 3


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    path = tmp_path_factory.mktemp("mix") / "mix.yaml"
    path.write_text(
        json.dumps(
            {
                "tasks": [
                    {"task": "simple_spelling", "size": 50},
                    {"task": "spelling_bee", "size": 15},
                    {"task": "arithmetic", "size": 15},
                ]
            }
        )
    )
    return load_mixture(path)


@pytest.fixture(scope="module")
def token_ds(mixture, tokenizer, tmp_path_factory):
    return tokenize_conversations(mixture, tokenizer, cache_dir=tmp_path_factory.mktemp("tok"))


def rendered(tokenizer, mixture, rows):
    return [render_conversation(tokenizer, loads(mixture[i]))[0] for i in rows]


def unpack(batches):
    """The token stream a sequence of micro-batches covers: rows overlap by one token within a micro-batch."""
    out = []
    for batch in batches:
        rows = batch["input_ids"]
        out += [t for row in rows[:-1] for t in row[:-1].tolist()] + rows[-1].tolist()
    return out


def test_tokenized_rows_match_renderer(mixture, token_ds, tokenizer):
    assert token_ds.column_names == ["input_ids", "labels", "num_tokens", "task"]
    assert token_ds["task"] == mixture["task"]
    expected = rendered(tokenizer, mixture, range(len(mixture)))
    assert token_ds["input_ids"] == expected and token_ds["labels"] == expected  # every token trained
    assert token_ds["num_tokens"] == [len(x) for x in expected]


def test_assistant_only_and_truncation(mixture, tokenizer, tmp_path):
    ds = tokenize_conversations(mixture, tokenizer, max_tokens=40, assistant_only=True, cache_dir=tmp_path)
    for i in range(len(ds)):
        ids, mask = render_conversation(tokenizer, loads(mixture[i]), max_tokens=40)
        assert ds[i]["input_ids"] == ids and len(ids) <= 40
        assert ds[i]["labels"] == [t if m else -100 for t, m in zip(ids, mask)]
    assert max(ds["num_tokens"]) == 40
    labels = [x for row in ds["labels"] for x in row]
    assert -100 in labels and sum(x != -100 for x in labels) > len(ds)


def test_tokenization_is_cached_by_fingerprint(mixture, tokenizer, tmp_path, monkeypatch):
    first = tokenize_conversations(mixture, tokenizer, cache_dir=tmp_path)

    def boom(*a, **k):
        raise AssertionError("re-tokenized although a cached result exists")

    monkeypatch.setattr(tokenizer_mod, "render_conversations", boom)
    again = tokenize_conversations(mixture, tokenizer, cache_dir=tmp_path)
    assert again["input_ids"] == first["input_ids"]
    with pytest.raises(AssertionError, match="re-tokenized"):  # other options: not the same cache entry
        tokenize_conversations(mixture, tokenizer, max_tokens=64, cache_dir=tmp_path)


def test_rows_shapes_and_stream_reconstruction(mixture, token_ds, tokenizer):
    stream = PackedStream(token_ds, max_seq_len=T, device_batch_size=B)
    full = [t for ids in rendered(tokenizer, mixture, range(len(mixture))) for t in ids]
    assert stream.num_micro_batches() == len(full) // (B * T + 1) == len(stream) > 3
    batches = list(stream)
    assert len(batches) == stream.num_micro_batches() and stream.progress == 1.0
    for batch in batches:
        assert batch["input_ids"].shape == batch["labels"].shape == (B, T + 1)
        assert batch["input_ids"].dtype == torch.long
        assert torch.equal(batch["input_ids"][:-1, -1], batch["input_ids"][1:, 0])
        assert torch.equal(batch["input_ids"], batch["labels"])
    assert unpack(batches) == full[: len(batches) * (B * T + 1)]
    # nanochat's view: inputs/targets of one micro-batch are the next B*T+1 tokens shifted by one
    chunk = torch.tensor(full[: B * T + 1])
    assert torch.equal(batches[0]["input_ids"][:, :-1], chunk[:-1].view(B, T))
    assert torch.equal(batches[0]["labels"][:, 1:], chunk[1:].view(B, T))


def test_two_ranks_disjoint_and_end_together(mixture, token_ds, tokenizer):
    streams = [PackedStream(token_ds, T, B, rank=r, world_size=2, chunk_size=7) for r in range(2)]
    n = streams[0].num_micro_batches()
    assert n == streams[1].num_micro_batches() > 0
    shares = [sum(len(x) for x in rendered(tokenizer, mixture, range(r, len(mixture), 2))) for r in range(2)]
    assert shares[0] != shares[1] and n == min(shares) // (B * T + 1)
    for r, stream in enumerate(streams):
        batches = list(stream)
        assert len(batches) == n
        own = [t for ids in rendered(tokenizer, mixture, range(r, len(mixture), 2)) for t in ids]
        assert unpack(batches) == own[: n * (B * T + 1)]


def test_resumed_stream_yields_the_same_next_batch(token_ds):
    reference = PackedStream(token_ds, T, B, rank=1, world_size=2)
    n = reference.num_micro_batches()
    expected = list(reference) + list(reference)  # two epochs
    for k in (0, 1, n - 1, n, n + 2):
        stream = PackedStream(token_ds, T, B, rank=1, world_size=2)
        it = iter(stream)
        for _ in range(k % n if k < n else n):
            next(it)
        if k >= n:  # finish epoch 0, then start epoch 1
            it = iter(stream)
            for _ in range(k - n):
                next(it)
        state = json.loads(json.dumps(stream.state_dict()))
        resumed = PackedStream(token_ds, T, B, rank=1, world_size=2)
        resumed.load_state_dict(state)
        assert resumed.progress == stream.progress
        batch = next(iter(resumed))
        assert torch.equal(batch["input_ids"], expected[k]["input_ids"]), k
        assert resumed.state_dict()["epoch"] == k // n


def test_resume_with_other_batch_settings_is_refused(token_ds):
    state = PackedStream(token_ds, T, B).state_dict()
    with pytest.raises(ValueError, match="device_batch_size=3 in the saved state, 2 here"):
        PackedStream(token_ds, T, 2).load_state_dict(state)
    del state["world_size"]  # a damaged file: refused, not taken as matching
    with pytest.raises(ValueError, match="world_size=None in the saved state, 1 here"):
        PackedStream(token_ds, T, B).load_state_dict(state)
