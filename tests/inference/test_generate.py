import pytest
import torch

from nanochat_hf.inference import fit_prompt, format_parts, generate_reply, parts_from_tokens
from nanochat_hf.tokenizer import render_conversation, render_for_completion

TOOL_CALL = [
    "<|assistant_start|>",
    "<|python_start|>",
    "2",
    "+",
    "3",
    "<|python_end|>",
    "?",
    "<|assistant_end|>",
    "a",
]  # "?" only if the tool output were NOT forced; "a" after the end


def test_tool_output_is_forced_and_generation_stops(tokenizer, wired, ids, conversation):
    model = wired(TOOL_CALL, ["<|output_end|>", "!"], ["!", "<|assistant_end|>"])
    reply = generate_reply(model, tokenizer, conversation)

    assert reply["token_ids"] == ids(
        "<|python_start|>",
        "2",
        "+",
        "3",
        "<|python_end|>",
        "<|output_start|>",
        "5",
        "<|output_end|>",
        "!",
        "<|assistant_end|>",
    )
    assert "<|python_end|><|output_start|>5<|output_end|>!<|assistant_end|>" in tokenizer.decode(reply["token_ids"])
    assert reply["parts"] == [
        {"type": "python", "text": "2+3"},
        {"type": "python_output", "text": "5"},
        {"type": "text", "text": "!"},
    ]
    assert reply["message"] == {"role": "assistant", "content": reply["parts"]}
    assert reply["text"] == "!"
    assert reply["finish_reason"] == "stop"
    assert format_parts(reply["parts"]) == "<<2+3=5>>!"
    # the message renders back to exactly the generated tokens (prompt + reply)
    rendered, _ = render_conversation(tokenizer, {"messages": conversation["messages"] + [reply["message"]]})
    assert rendered == render_for_completion(tokenizer, conversation) + reply["token_ids"]


def test_no_result_continues_without_forcing(tokenizer, wired, ids, conversation):
    chain = ["<|assistant_start|>", "<|python_start|>", "2", "/", "0", "<|python_end|>", "?", "<|assistant_end|>"]
    reply = generate_reply(wired(chain), tokenizer, conversation)  # 2/0 -> None
    assert reply["token_ids"] == ids(*chain[1:])
    assert reply["parts"] == [{"type": "python", "text": "2/0"}, {"type": "text", "text": "?"}]
    assert format_parts(reply["parts"]) == "<<2/0=?>>?"


def test_max_new_tokens_and_bos_stop(tokenizer, wired, ids, conversation):
    reply = generate_reply(wired(["<|assistant_start|>", "a", "a"]), tokenizer, conversation, max_new_tokens=5)
    assert reply["token_ids"] == ids("a") * 5
    assert (reply["text"], reply["finish_reason"]) == ("aaaaa", "length")
    # <|bos|> also ends the reply (nanochat's engine stops on it)
    reply = generate_reply(wired(["<|assistant_start|>", "a", "<|bos|>", "b"]), tokenizer, conversation)
    assert reply["token_ids"] == ids("a", "<|bos|>")
    assert (reply["text"], reply["finish_reason"]) == ("a", "stop")


def test_forced_tokens_count_towards_the_budget(tokenizer, wired, ids, conversation):
    model = wired(TOOL_CALL, ["<|output_end|>", "!"], ["!", "<|assistant_end|>"])
    reply = generate_reply(model, tokenizer, conversation, max_new_tokens=7)
    assert reply["token_ids"] == ids("<|python_start|>", "2", "+", "3", "<|python_end|>", "<|output_start|>", "5")
    assert reply["parts"][-1] == {"type": "python_output", "text": "5"}  # unterminated block still a part
    assert reply["finish_reason"] == "length"


def test_uses_kv_cache_and_matches_full_forward(tokenizer, random_model, conversation):
    fed = []
    # a hook, not a replaced forward: generate() validates its arguments against the forward's signature
    hook = random_model.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    reply = generate_reply(random_model, tokenizer, conversation, max_new_tokens=12)
    hook.remove()
    tokens = reply["token_ids"]
    prompt = render_for_completion(tokenizer, conversation)
    # prefill once, then one new token per forward (the last one is never fed)
    assert fed == [len(prompt)] + [1] * (len(tokens) - 1)
    # every generated token is the argmax of a full (cache-free) forward over the sequence before it
    with torch.no_grad():
        logits = random_model(torch.tensor([prompt + tokens]), use_cache=False).logits[0]
    assert tokens == logits[len(prompt) - 1 : -1].argmax(-1).tolist()


def test_sampling_is_seeded_and_top_k_1_is_greedy(tokenizer, random_model, conversation):
    kw = dict(max_new_tokens=10, temperature=1.0, top_k=50)
    a = generate_reply(random_model, tokenizer, conversation, seed=1, **kw)["token_ids"]
    assert a == generate_reply(random_model, tokenizer, conversation, seed=1, **kw)["token_ids"]
    greedy = generate_reply(random_model, tokenizer, conversation, max_new_tokens=10)["token_ids"]
    top1 = generate_reply(random_model, tokenizer, conversation, max_new_tokens=10, temperature=0.8, top_k=1, seed=3)
    assert top1["token_ids"] == greedy
    assert a != greedy  # temperature 1 over a random model's flat-ish logits does differ


def test_restores_training_mode(tokenizer, random_model, conversation):
    random_model.train()
    generate_reply(random_model, tokenizer, conversation, max_new_tokens=2)
    assert random_model.training


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
    ],
)
def test_bad_options(tokenizer, random_model, conversation, kw, message):
    with pytest.raises(ValueError, match=message):
        generate_reply(random_model, tokenizer, conversation, **kw)


def test_parts_from_tokens_text_only(tokenizer):
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    assert parts_from_tokens(tokenizer, ids + [tokenizer.convert_tokens_to_ids("<|assistant_end|>")]) == [
        {"type": "text", "text": "hello there"}
    ]
    assert parts_from_tokens(tokenizer, []) == []


def test_bad_conversation(tokenizer, random_model):
    with pytest.raises(ValueError, match="roles alternate"):
        generate_reply(random_model, tokenizer, {"messages": [{"role": "assistant", "content": "hi"}]})


def test_fit_prompt_keeps_bos_and_the_most_recent_tokens():
    prompt = list(range(100, 120))
    assert fit_prompt(prompt, sequence_len=64, max_new_tokens=8) == prompt
    assert fit_prompt(prompt, sequence_len=16, max_new_tokens=6) == [100, *range(111, 120)]  # 10 + 6 = 16
    with pytest.raises(
        ValueError, match="max_new_tokens=15 leaves no room for a prompt within the model's sequence_len=16"
    ):
        fit_prompt(prompt, sequence_len=16, max_new_tokens=15)
