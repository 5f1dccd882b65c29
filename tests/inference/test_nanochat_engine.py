"""Tool use through generate() gives the tokens nanochat's own engine gives: the same calls, the same forced
outputs (nanochat's text), the same budget (forced tokens count).

data/nanochat_engine.json was written by nanochat's Engine.generate_batch at 790f3be and 92d63d4 (identical) with a
stand-in model whose next token is a fixed function of the current one, and the tokenizer its tok_train.py wrote
(tests/tokenizer/data/nanochat_92d63d4); see data/README.md. Our model is wired to the same function.
"""

import itertools
import json
from pathlib import Path

import pytest
import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.inference import decode_completion, generate_tokens
from nanochat_hf.tokenizer import load_nanochat_tokenizer, render_for_completion

CASES = json.loads((Path(__file__).parent / "data" / "nanochat_engine.json").read_text())


@pytest.fixture(scope="module")
def tok():
    return load_nanochat_tokenizer(
        Path(__file__).parents[1] / "tokenizer" / "data" / "nanochat_92d63d4", trust_pickle=True
    )


def wired(vocab: int, chains: list[list[int]]) -> NanoChatGPTForCausalLM:
    """One-hot embedding, blocks that add nothing (zero c_proj at init), lm_head row dst = column src: the greedy
    next token of src is dst, and of any other token id 0 (all logits equal), as the stand-in nanochat ran."""
    config = NanoChatGPTConfig(sequence_len=128, vocab_size=vocab, n_layer=1, n_head=2, n_embd=512)
    model = NanoChatGPTForCausalLM(config).eval()
    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.eye(vocab, config.n_embd))
        model.lm_head.weight.zero_()
        for chain in chains:
            for src, dst in itertools.pairwise(chain):
                model.lm_head.weight[dst, src] = 1.0
    return model


@pytest.mark.parametrize("case", CASES, ids=[c["user"] for c in CASES])
def test_same_tokens_as_nanochats_engine(tok, case):
    conversation = {"messages": [{"role": "user", "content": case["user"]}]}
    prompt = render_for_completion(tok, conversation)
    assert prompt == case["prompt"]
    (reply,) = generate_tokens(wired(len(tok), case["chains"]), tok, [prompt], max_new_tokens=case["max_tokens"])
    assert decode_completion(tok, reply) == case["decoded"]
    stopped = reply[-1] == tok.convert_tokens_to_ids("<|assistant_end|>")
    assert (reply[:-1] if stopped else reply) == case["tokens"]
