"""The fast tokenizer: split regex, special tokens, training, token_bytes, save/load."""

import json
import subprocess
import sys

import pytest
import regex
import torch
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

from nanochat_hf.tokenizer import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    render_conversation,
    to_mergeable_ranks,
    token_bytes,
    train_tokenizer,
)
from nanochat_hf.tokenizer.tokenizer import bytes_to_token


def test_split_regex_matches_regex_module(samples, fuzz):
    # onig (tokenizers) must accept the possessive quantifiers and split exactly like the `regex` module
    split = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    for text in samples + fuzz(seed=2, count=300):
        ours = [piece for piece, _ in split.pre_tokenize_str(text)]
        assert ours == regex.findall(SPLIT_PATTERN, text), repr(text)


def test_split_regex_known_pieces():
    split = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    pieces = [p for p, _ in split.pre_tokenize_str("I'LL pay 12345 $!!\n\n  now")]
    assert pieces == ["I", "'LL", " pay", " ", "12", "34", "5", " $!!\n\n", " ", " now"]


def test_specials_last_in_nanochat_order(tok):
    n = len(tok)
    assert tok.convert_ids_to_tokens(list(range(n - 9, n))) == list(SPECIAL_TOKENS)
    assert tok.bos_token == "<|bos|>" and tok.bos_token_id == n - 9
    assert tok.eos_token == "<|assistant_end|>" and tok.eos_token_id == n - 5
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    assert tok.chat_template == CHAT_TEMPLATE
    # every byte is a token, so nothing is unknown
    assert tok.unk_token is None
    # special strings in text become the special token; plain text starts with <|bos|> (add_special_tokens=False:
    # none), as nanochat scores every document after it
    assert tok.encode("<|python_start|>", add_special_tokens=False) == [n - 4]
    assert tok.encode("<|python_start|>") == [n - 9, n - 4]
    assert tok("a")["input_ids"] == [tok.bos_token_id, 97] and tok("a", add_special_tokens=False)["input_ids"] == [97]
    assert tok("a", "b")["input_ids"] == [tok.bos_token_id, 97, tok.bos_token_id, 98]


def test_byte_tokens_in_byte_order(tok):
    # as nanochat: id b is the single byte b, merged tokens follow
    assert [tok.convert_tokens_to_ids(bytes_to_token(bytes([b]))) for b in range(256)] == list(range(256))
    assert tok.encode("A", add_special_tokens=False) == [65]
    assert tok.encode("\x00\x7f", add_special_tokens=False) == [0, 127]


def test_roundtrip_decode(tok, samples, fuzz):
    for text in samples + fuzz(seed=3, count=50):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_left_padding(tok):
    batch = tok(["a", "hello world"], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id and batch["input_ids"][1][0] == tok.bos_token_id
    assert batch["input_ids"][0][-2:] == [tok.bos_token_id, 97]
    assert batch["attention_mask"][0][0] == 0 and batch["attention_mask"][1] == [1] * len(batch["input_ids"][1])


def test_training_respects_vocab_size(corpus):
    tok = train_tokenizer(corpus, 600)
    assert len(tok) == 600
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_tokenizer(corpus, 100)


TRAIN_SNIPPET = """
import json, sys
from nanochat_hf.tokenizer import train_tokenizer
texts = json.load(open(sys.argv[1]))
print(train_tokenizer(texts, 700).backend_tokenizer.to_str())
"""


@pytest.mark.slow
def test_training_deterministic_across_processes(corpus, tmp_path):
    # a fresh process has other hash seeds (Python and Rust): the vocab and merges must not change
    texts = corpus[::3]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    tok = train_tokenizer(texts, 700)
    assert json.loads(train_tokenizer(texts, 700).backend_tokenizer.to_str()) == json.loads(
        tok.backend_tokenizer.to_str()
    )
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_SNIPPET, str(tmp_path / "texts.json")], capture_output=True, text=True, check=True
    ).stdout
    ours, theirs = json.loads(tok.backend_tokenizer.to_str()), json.loads(out)
    assert ours["model"]["vocab"] == theirs["model"]["vocab"]
    assert ours["model"]["merges"] == theirs["model"]["merges"]
    assert ours["added_tokens"] == theirs["added_tokens"]


def test_token_bytes(tok):
    tb = token_bytes(tok)
    assert tb.dtype == torch.int64 and tb.shape == (len(tok),)
    n = len(tok)
    assert tb[n - 9 :].tolist() == [0] * 9
    ranks, specials = to_mergeable_ranks(tok)
    assert sorted(specials.values()) == list(range(n - 9, n))
    # nanochat's count: UTF-8 length of the token's decoded string, invalid UTF-8 replaced by U+FFFD (3 bytes)
    for data, idx in ranks.items():
        assert tb[idx] == len(data.decode("utf-8", errors="replace").encode("utf-8")), data
    # ids 0-255 are the single bytes: ASCII counts 1, each lone byte 0x80-0xFF counts 3 (not 1)
    assert tb[:128].tolist() == [1] * 128 and tb[128:256].tolist() == [3] * 128
    # merged tokens holding part of a multi-byte character differ from their raw length too
    partial = [data for data in ranks if len(data) > 1 and tb[ranks[data]] != len(data)]
    assert partial, "the corpus should produce merges that split a multi-byte character"
    assert tb[tok.convert_tokens_to_ids("a")] == 1
    assert tb[tok.convert_tokens_to_ids("Ġ")] == 1  # the space byte
    assert tb[tok.convert_tokens_to_ids(bytes_to_token("日".encode()[:1]))] == 3


def test_save_pretrained_roundtrip(tok, tmp_path, samples):
    conv = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "2+2?"},
            {
                "role": "assistant",
                "content": [{"type": "python", "text": "2+2"}, {"type": "python_output", "text": "4"}],
            },
        ]
    }
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == CHAT_TEMPLATE
    assert len(loaded) == len(tok)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "padding_side", "all_special_tokens"):
        assert getattr(loaded, attr) == getattr(tok, attr), attr
    assert loaded.convert_ids_to_tokens(list(range(len(tok) - 9, len(tok)))) == list(SPECIAL_TOKENS)
    for text in samples:
        assert loaded.encode(text) == tok.encode(text)
        assert loaded.encode(text)[0] == tok.bos_token_id
    assert render_conversation(loaded, conv) == render_conversation(tok, conv)
    out = loaded.apply_chat_template(conv["messages"], return_dict=True, return_assistant_tokens_mask=True)
    assert (out["input_ids"], out["assistant_masks"]) == render_conversation(tok, conv)
