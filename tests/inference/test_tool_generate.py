"""Tool use through transformers' generate(): the same tokens as the former hand-written loop, batches."""

import json
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor

from nanochat_hf.inference import CalculatorToolProcessor, generate_replies, generate_reply, generate_tokens
from nanochat_hf.tokenizer import render_for_completion

CASES = json.loads((Path(__file__).parent / "data" / "loop_outputs.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['model']}-{c['max_new_tokens']}" for c in CASES])
def test_greedy_matches_the_former_loop(case, tokenizer, random_model, wired):
    model = random_model if case["model"] == "random" else wired(*case["chains"])
    reply = generate_reply(model, tokenizer, case["conversation"], max_new_tokens=case["max_new_tokens"])
    assert reply["token_ids"] == case["token_ids"]


def test_forced_output_longer_than_one_token(tokenizer, wired, ids):
    case = next(c for c in CASES if c["model"] == "wired_12*7+3" and c["max_new_tokens"] == 64)
    reply = generate_reply(wired(*case["chains"]), tokenizer, case["conversation"])
    assert reply["token_ids"] == ids(
        "<|python_start|>",
        "12",
        "*",
        "7",
        "+",
        "3",
        "<|python_end|>",
        "<|output_start|>",
        "8",
        "7",
        "<|output_end|>",
        "!",
        "<|assistant_end|>",
    )
    assert reply["parts"][:2] == [{"type": "python", "text": "12*7+3"}, {"type": "python_output", "text": "87"}]


def test_batched_left_padded_equals_one_by_one(tokenizer, random_model):
    conversations = [c["conversation"] for c in CASES if c["model"] == "random" and c["max_new_tokens"] == 24]
    prompts = [render_for_completion(tokenizer, c) for c in conversations]
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths: the batch is really padded
    batched = generate_replies(random_model, tokenizer, conversations, max_new_tokens=24)
    single = [generate_reply(random_model, tokenizer, c, max_new_tokens=24) for c in conversations]
    assert [r["token_ids"] for r in batched] == [r["token_ids"] for r in single]


def test_batched_tool_use_rows_are_independent(tokenizer, wired, ids):
    # row 0 calls the tool at once; row 1 (another prompt) first writes text, so its call comes later
    model = wired(
        ["<|assistant_start|>", "<|python_start|>", "12", "*", "7", "+", "3", "<|python_end|>", "?"],
        ["<|output_end|>", "!", "<|assistant_end|>"],
        ["<|user_end|>", "a", "b", "c", "d", "e"],
        ["h", "<|python_start|>"],
    )
    prompts = [
        render_for_completion(tokenizer, {"messages": [{"role": "user", "content": "x"}]}),
        ids("<|bos|>", "<|user_start|>", "h"),
    ]
    expected = ids(
        "<|python_start|>",
        "12",
        "*",
        "7",
        "+",
        "3",
        "<|python_end|>",
        "<|output_start|>",
        "8",
        "7",
        "<|output_end|>",
        "!",
        "<|assistant_end|>",
    )
    assert generate_tokens(model, tokenizer, prompts, max_new_tokens=20) == [expected, expected]
    assert generate_tokens(model, tokenizer, prompts[1:], max_new_tokens=20) == [expected]


def test_forcing_holds_under_sampling(tokenizer, wired, ids):
    # the wired model writes the call (sharp logits) and has no preference after <|python_end|> (all logits
    # equal): sampled freely, <|output_start|> 8 7 <|output_end|> would come with probability 300**-4
    model = wired(["<|assistant_start|>", "<|python_start|>", "12", "*", "7", "+", "3", "<|python_end|>"])
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    prompt = render_for_completion(tokenizer, {"messages": [{"role": "user", "content": "x"}]})
    for seed, top_k in ((0, None), (1, None), (2, 5)):
        (reply,) = generate_tokens(
            model, tokenizer, [prompt], max_new_tokens=12, temperature=1.0, top_k=top_k, seed=seed
        )
        start = reply.index(ids("<|python_end|>")[0])
        assert reply[start + 1 : start + 5] == ids("<|output_start|>", "8", "7", "<|output_end|>")


def test_processor_leaves_other_rows_and_prompt_calls_alone(tokenizer, ids):
    processor = CalculatorToolProcessor(tokenizer)
    assert isinstance(processor, LogitsProcessor)  # what generate() takes in its logits_processor list
    done = ids("<|python_start|>", "2", "+", "3", "<|python_end|>", "<|output_start|>", "5", "<|output_end|>")
    rows = [
        ids("<|bos|>", "<|python_start|>", "2", "+", "3", "<|python_end|>"),  # force <|output_start|>
        ids("<|bos|>") + done[:6],  # ... "5"   (here and below: left pad of the same width)
        ids("<|bos|>", "<|python_start|>", "2", "/", "0", "<|python_end|>"),  # no result: free
        [ids("<|bos|>")[0]] * 2 + done[2:],  # a call in the past, already answered: free
        ids("<|bos|>", "<|bos|>", "<|python_end|>", "2", "+", "3"),
    ]  # no call
    width = max(map(len, rows))
    input_ids = torch.tensor([[ids("<|bos|>")[0]] * (width - len(r)) + r for r in rows])
    scores = torch.randn(len(rows), len(tokenizer))
    out = processor(input_ids, scores.clone())
    assert out[0].argmax() == ids("<|output_start|>")[0] and torch.isinf(out[0]).sum() == len(tokenizer) - 1
    assert out[1].argmax() == ids("5")[0] and torch.isinf(out[1]).sum() == len(tokenizer) - 1
    assert torch.equal(out[2:], scores[2:])
