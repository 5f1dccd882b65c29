"""Auto-class registration, auto_map + code files, and the chat pipeline.

Loading the saved code in a fresh process without the package is tested in tests/conversion."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, pipeline

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM


def test_auto_classes_registered_and_auto_map_written(make_model, tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "nanochat_gpt"
    assert config["auto_map"] == {"AutoConfig": "configuration_nanochat_gpt.NanoChatGPTConfig",
                                  "AutoModelForCausalLM": "modeling_nanochat_gpt.NanoChatGPTForCausalLM"}
    assert (tmp_path / "modeling_nanochat_gpt.py").is_file() and (tmp_path / "configuration_nanochat_gpt.py").is_file()
    assert isinstance(AutoConfig.for_model("nanochat_gpt"), NanoChatGPTConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert type(loaded) is NanoChatGPTForCausalLM and loaded.config._attn_implementation == "eager"


@pytest.mark.slow
def test_text_generation_pipeline_with_chat_template():
    from nanochat_hf.tokenizer import render_for_completion, train_tokenizer

    texts = ["hello there, how are you today? the quick brown fox jumps over the lazy dog."] * 20
    tokenizer = train_tokenizer(texts, vocab_size=300)
    config = NanoChatGPTConfig(sequence_len=64, vocab_size=len(tokenizer), n_layer=2, n_head=4, n_kv_head=2,
                               n_embd=64, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id)
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
    with torch.no_grad():
        # explicit mask: pad == bos here, so generate() would otherwise mask out the leading <|bos|>
        ids = torch.tensor([prompt])
        ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        ids = ids[0, len(prompt):]
    assert reply["content"] == tokenizer.decode(ids, skip_special_tokens=True)
