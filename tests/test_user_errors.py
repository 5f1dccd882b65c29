"""Bad input reaches the entry points as `UserError` from every library layer (a couple of representative cases
each; the layers' own tests check the messages in detail): one line naming the file, field or value."""

from __future__ import annotations

import json

import pytest
import torch

from nanochat_hf.errors import UserError


def _one_line_naming(info: pytest.ExceptionInfo, *words: str) -> None:
    message = str(info.value)
    assert type(info.value) is UserError and "\n" not in message, repr(info.value)
    assert all(w in message for w in words), message


def test_conversion_of_a_bad_nanochat_checkpoint(tmp_path):
    from nanochat_hf.conversion import read_nanochat_checkpoint

    torch.save({"transformer.wte.weight": torch.zeros(2, 2)}, tmp_path / "model_000001.pt")
    (tmp_path / "meta_000001.json").write_text("{oops")
    with pytest.raises(UserError) as info:
        read_nanochat_checkpoint(tmp_path)
    _one_line_naming(info, "meta_000001.json", "not valid JSON")
    (tmp_path / "meta_000001.json").write_text(json.dumps({"model_config": {"n_layer": "two"}}))
    with pytest.raises(UserError) as info:
        read_nanochat_checkpoint(tmp_path)
    _one_line_naming(info, "meta_000001.json", "model_config")


def test_a_bad_training_argument(tmp_path):
    from nanochat_hf.training.arguments import parse_args

    with pytest.raises(UserError) as info:
        parse_args(["--packing", "zigzag", "--output_dir", str(tmp_path)])
    _one_line_naming(info, "packing='zigzag'", "stream or bestfit")
    with pytest.raises(UserError) as info:  # transformers' own check of its fields, kept to its first line
        parse_args(["--save_steps", "3", "--eval_every", "2", "--load_best_model_at_end", "true"])
    _one_line_naming(info, "load_best_model_at_end", "3", "2")
    config = tmp_path / "run.yaml"
    config.write_text("device_batch_size: [1\n")
    with pytest.raises(UserError) as info:
        parse_args([str(config)])
    _one_line_naming(info, str(config), "not valid YAML")


def test_a_bad_tokenizer_dir(tmp_path):
    from nanochat_hf.tokenizer import load_nanochat_tokenizer

    (tmp_path / "tokenizer.pkl").write_bytes(b"\x80\x04N.")  # the pickle of None
    with pytest.raises(UserError) as info:
        load_nanochat_tokenizer(tmp_path)
    _one_line_naming(info, "tokenizer.pkl", "--trust-pickle")
    with pytest.raises(UserError) as info:
        load_nanochat_tokenizer(tmp_path, trust_pickle=True)
    _one_line_naming(info, "tokenizer.pkl", "not a pickled tiktoken.Encoding")


def test_a_bad_model_folder(tmp_path):
    from nanochat_hf.training.model_source import load_hf_dir, load_pretrained

    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 2}))
    with pytest.raises(UserError) as info:
        load_hf_dir(tmp_path)
    _one_line_naming(info, "config.json", "model_type")
    with pytest.raises(UserError) as info:
        load_pretrained(str(tmp_path / "nowhere"))
    _one_line_naming(info, "--model", "nowhere", "no such model directory")


def test_bad_generation_settings_and_conversations():
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.inference import fit_prompt
    from nanochat_hf.tokenizer import render_conversation

    tokenizer = demo_tokenizer()
    with pytest.raises(UserError) as info:
        fit_prompt(list(range(10)), sequence_len=8, max_new_tokens=7)
    _one_line_naming(info, "max_new_tokens=7", "sequence_len=8")
    with pytest.raises(UserError) as info:
        render_conversation(tokenizer, {"messages": [{"role": "assistant", "content": "hi"}]})
    _one_line_naming(info, "message 0", "'assistant'", "'user'")
