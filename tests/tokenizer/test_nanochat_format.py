"""nanochat's tokenizer directory (tokenizer.pkl + token_bytes.pt): opt-in, conversion with tiktoken's ids."""

import math
import os
import pickle

import pytest
import torch

from nanochat_hf.tokenizer import (
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    load_nanochat_tokenizer,
    render_conversation,
    save_nanochat_tokenizer,
    token_bytes,
)
from nanochat_hf.training.evaluation import evaluate_bpb

tiktoken = pytest.importorskip("tiktoken")


def test_refuses_pickle_without_opt_in(nanochat_tokenizer_dir):
    with pytest.raises(ValueError, match="can run arbitrary code.*trust_pickle=True"):
        load_nanochat_tokenizer(nanochat_tokenizer_dir)


def test_missing_pickle(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.pkl: no such file"):
        load_nanochat_tokenizer(tmp_path, trust_pickle=True)


def test_same_ids_as_tiktoken(nanochat_tokenizer_dir, tiktoken_encoding, samples, fuzz):
    tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    assert len(tok) == tiktoken_encoding.n_vocab
    texts = samples + fuzz(seed=7, count=200) + ["", " ", "\n", "  \n\n \t ", "a" * 300, "1" * 41]
    for text in texts:
        assert tok.encode(text, add_special_tokens=False) == tiktoken_encoding.encode_ordinary(text), repr(text)
        assert tok.encode(text) == [tok.bos_token_id] + tiktoken_encoding.encode_ordinary(text), repr(text)
    # every special token, alone and inside text
    with_specials = " x".join(SPECIAL_TOKENS) + " tail <|bos|><|bos|>\n"
    assert tok.encode(with_specials, add_special_tokens=False) == tiktoken_encoding.encode(
        with_specials, allowed_special="all"
    )
    for name in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(name) == tiktoken_encoding.encode_single_token(name)
    assert tok.bos_token_id == tiktoken_encoding.encode_single_token("<|bos|>")
    assert tok.eos_token_id == tiktoken_encoding.encode_single_token("<|assistant_end|>")
    # decoding and token byte lengths agree too
    ids = tiktoken_encoding.encode(with_specials, allowed_special="all")
    assert tok.decode(ids) == tiktoken_encoding.decode(ids)
    expected = torch.load(nanochat_tokenizer_dir / "token_bytes.pt", weights_only=True)
    assert torch.equal(token_bytes(tok), expected.long())


def test_renderer_uses_tiktoken_ordinary_encoding(nanochat_tokenizer_dir, tiktoken_encoding):
    tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    content = "Count <|python_start|> in 'strawberry' 12345 日本"
    ids, mask = render_conversation(tok, {"messages": [{"role": "user", "content": content}]})
    enc = tiktoken_encoding
    s = enc.encode_single_token
    assert ids == [s("<|bos|>"), s("<|user_start|>")] + enc.encode_ordinary(content) + [s("<|user_end|>")]
    assert mask == [0] * len(ids)


def test_refuses_foreign_objects_even_when_trusted(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    (tmp_path / "tokenizer.pkl").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_nanochat_tokenizer(tmp_path, trust_pickle=True)
    assert not marker.exists()


def test_token_bytes_mismatch_is_reported(nanochat_tokenizer_dir):
    path = nanochat_tokenizer_dir / "token_bytes.pt"
    bad = torch.load(path, weights_only=True)
    bad[300] += 1
    torch.save(bad, path)
    with pytest.raises(ValueError, match="token_bytes.pt: token 300 counts .* which follows neither"):
        load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    torch.save(bad[:-1], path)
    with pytest.raises(ValueError, match="token_bytes.pt: expected an integer tensor of shape"):
        load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)


def test_save_nanochat_roundtrip(tok, tmp_path, samples):
    # our trained tokenizer -> nanochat's layout -> tiktoken (as nanochat would load it) and back
    save_nanochat_tokenizer(tok, tmp_path)
    with open(tmp_path / "tokenizer.pkl", "rb") as f:
        enc = pickle.load(f)
    assert enc._pat_str == SPLIT_PATTERN and enc.n_vocab == len(tok)
    back = load_nanochat_tokenizer(tmp_path, trust_pickle=True)
    for text in samples:
        assert (
            enc.encode_ordinary(text)
            == tok.encode(text, add_special_tokens=False)
            == back.encode(text, add_special_tokens=False)
        )
        assert back.encode(text) == tok.encode(text)
    written = torch.load(tmp_path / "token_bytes.pt", weights_only=True)
    assert written.dtype == torch.int32
    # the counts tok_train.py would write for this Encoding
    specials = set(enc._special_tokens.values())
    expected = [0 if i in specials else len(enc.decode([i]).encode("utf-8")) for i in range(enc.n_vocab)]
    assert written.tolist() == expected


def test_missing_token_bytes_warns(nanochat_tokenizer_dir, tiktoken_encoding):
    (nanochat_tokenizer_dir / "token_bytes.pt").unlink()
    with pytest.warns(UserWarning, match="token_bytes.pt not found"):
        tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    assert tok.encode("hello world", add_special_tokens=False) == tiktoken_encoding.encode_ordinary("hello world")


def test_token_bytes_equal_the_real_layout_file(nanochat_tokenizer_dir, tiktoken_encoding):
    # the fixture has the 128 byte tokens 0x80-0xFF and merges that cut multi-byte characters: nanochat counts
    # each U+FFFD of their decoded string as 3 bytes, so raw byte lengths differ on all of them
    expected = torch.load(nanochat_tokenizer_dir / "token_bytes.pt", weights_only=True)
    raw = [len(tiktoken_encoding.decode_single_token_bytes(i)) for i in range(256, len(expected) - 9)]
    assert expected[128:256].tolist() == [3] * 128
    assert sum(r != int(e) for r, e in zip(raw, expected[256:-9])) > 20
    tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)  # accepts the file
    assert torch.equal(token_bytes(tok), expected.long())


class _LossIsIdMod7(torch.nn.Module):
    """Per-token loss (nats) = 1 + target id mod 7, so bits per byte can be worked out by hand."""

    def forward(self, input_ids, labels, loss_reduction):
        tgt = labels[:, 1:]
        return type("Out", (), {"loss": torch.where(tgt == -100, 0.0, 1.0 + tgt.float() % 7)})()


def test_bits_per_byte_on_unicode_text_uses_decoded_counts(nanochat_tokenizer_dir, tiktoken_encoding, samples):
    tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    enc = tiktoken_encoding
    text = "\n".join(samples[3:6])  # CJK, emoji, accented and non-Latin scripts
    ids = [enc.encode_single_token("<|bos|>")] + enc.encode_ordinary(text)
    labels = torch.tensor([ids])
    bpb = evaluate_bpb(_LossIsIdMod7(), [{"input_ids": labels, "labels": labels}], token_bytes(tok), "cpu")
    # by hand: targets are ids[1:]; each counts the UTF-8 length of its own decoded string
    nats = sum(1 + t % 7 for t in ids[1:])
    nbytes = sum(len(enc.decode([t]).encode("utf-8")) for t in ids[1:])
    assert bpb == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-6)
    # with raw byte lengths (the text's UTF-8 length) the number would be visibly different
    assert nbytes != len(text.encode("utf-8"))
    assert abs(bpb - nats / (math.log(2) * len(text.encode("utf-8")))) > 0.01 * bpb
