"""Auto-class registration, auto_map + code files, and the chat pipeline.

Loading the saved code in a fresh process without the package is tested in tests/conversion."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, pipeline

from nanochat_hf import (
    NanoChatGPTConfig,
    NanoChatGPTForCausalLM,
    NanoChatGPTForSequenceClassification,
    NanoChatGPTModel,
)


def test_auto_classes_registered_and_auto_map_written(make_model, tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "nanochat_gpt"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_nanochat_gpt.NanoChatGPTConfig",
        "AutoModel": "modeling_nanochat_gpt.NanoChatGPTModel",
        "AutoModelForCausalLM": "modeling_nanochat_gpt.NanoChatGPTForCausalLM",
        "AutoModelForSequenceClassification": "modeling_nanochat_gpt.NanoChatGPTForSequenceClassification",
    }
    assert (tmp_path / "modeling_nanochat_gpt.py").is_file() and (tmp_path / "configuration_nanochat_gpt.py").is_file()
    assert isinstance(AutoConfig.for_model("nanochat_gpt"), NanoChatGPTConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert type(loaded) is NanoChatGPTForCausalLM and loaded.config._attn_implementation == "eager"
    # the backbone alone (weights under transformer.*) and the classification head load from the same directory
    backbone = AutoModel.from_pretrained(tmp_path)
    assert type(backbone) is NanoChatGPTModel
    assert torch.equal(backbone.h[1].attn.c_q.weight, model.transformer.h[1].attn.c_q.weight)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert type(classifier) is NanoChatGPTForSequenceClassification
    assert torch.equal(classifier.transformer.wte.weight, model.transformer.wte.weight)


@pytest.mark.slow
def test_text_generation_pipeline_with_chat_template():
    from nanochat_hf.tokenizer import render_for_completion, train_tokenizer

    texts = ["hello there, how are you today? the quick brown fox jumps over the lazy dog."] * 20
    tokenizer = train_tokenizer(texts, vocab_size=300)
    config = NanoChatGPTConfig(
        sequence_len=64,
        vocab_size=len(tokenizer),
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = NanoChatGPTForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    messages = [{"role": "user", "content": "hello fox"}]
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    out = generator(messages, max_new_tokens=8, do_sample=False)
    reply = out[0]["generated_text"][-1]
    assert reply["role"] == "assistant"
    # same as rendering the prompt nanochat's way and decoding greedy tokens ourselves
    prompt = render_for_completion(tokenizer, {"messages": messages})
    with torch.no_grad():  # no attention mask: pad == bos, yet the leading <|bos|> is not taken for padding
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :]
    assert reply["content"] == tokenizer.decode(ids, skip_special_tokens=True)
