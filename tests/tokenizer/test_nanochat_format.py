"""nanochat's tokenizer directory (tokenizer.pkl + token_bytes.pt): opt-in, conversion with tiktoken's ids."""

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
    assert tok.encode(with_specials, add_special_tokens=False) == tiktoken_encoding.encode(with_specials,
                                                                                     allowed_special="all")
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
    with pytest.raises(ValueError, match="token_bytes.pt: token 300 has"):
        load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    torch.save(bad[:-1], path)
    with pytest.raises(ValueError, match="token_bytes.pt: expected a tensor of shape"):
        load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)


def test_save_nanochat_roundtrip(tok, tmp_path, samples):
    # our trained tokenizer -> nanochat's layout -> tiktoken (as nanochat would load it) and back
    save_nanochat_tokenizer(tok, tmp_path)
    with open(tmp_path / "tokenizer.pkl", "rb") as f:
        enc = pickle.load(f)
    assert enc._pat_str == SPLIT_PATTERN and enc.n_vocab == len(tok)
    back = load_nanochat_tokenizer(tmp_path, trust_pickle=True)
    for text in samples:
        assert enc.encode_ordinary(text) == tok.encode(text, add_special_tokens=False) == \
            back.encode(text, add_special_tokens=False)
        assert back.encode(text) == tok.encode(text)
    assert torch.load(tmp_path / "token_bytes.pt", weights_only=True).dtype == torch.int32


def test_missing_token_bytes_warns(nanochat_tokenizer_dir, tiktoken_encoding):
    (nanochat_tokenizer_dir / "token_bytes.pt").unlink()
    with pytest.warns(UserWarning, match="token_bytes.pt not found"):
        tok = load_nanochat_tokenizer(nanochat_tokenizer_dir, trust_pickle=True)
    assert tok.encode("hello world", add_special_tokens=False) == tiktoken_encoding.encode_ordinary("hello world")
