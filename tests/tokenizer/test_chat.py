"""Conversation rendering: the Python renderer vs nanochat's rules (docs/nanochat.md, section 3), and the chat
template vs the renderer."""

import pytest
from jinja2.exceptions import TemplateError

from nanochat_hf.tokenizer import render_conversation, render_conversations, render_for_completion

TOOL_CONV = {
    "messages": [
        {"role": "system", "content": "You are helpful.\nBe brief."},
        {"role": "user", "content": "How many r in 'strawberry'? Also 12*34?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me count. "},
                {"type": "python", "text": "'strawberry'.count('r')"},
                {"type": "python_output", "text": "3"},
                {"type": "text", "text": "There are 3. And "},
                {"type": "python", "text": "12*34"},
                {"type": "python_output", "text": "408"},
                {"type": "text", "text": " so 408.\n"},
            ],
        },
        {"role": "user", "content": "  Thanks!  \n"},
        {"role": "assistant", "content": "You're welcome 😀 -- 日本語 too."},
    ]
}

CONVERSATIONS = [
    TOOL_CONV,
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    # python_output followed directly by text, output at the very end, empty parts and contents
    {
        "messages": [
            {"role": "system", "content": ""},
            {"role": "user", "content": ""},
            {
                "role": "assistant",
                "content": [
                    {"type": "python", "text": "1+1"},
                    {"type": "python_output", "text": "2"},
                    {"type": "text", "text": ""},
                    {"type": "python", "text": ""},
                    {"type": "python_output", "text": "x\n\n"},
                ],
            },
            {"role": "user", "content": "\n"},
            {"role": "assistant", "content": ""},
        ]
    },
    # user and system content as lists of text parts (what pipelines and TRL send), joined
    {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "and 12*34?"}]},
        ]
    },
    # ends with a user turn
    {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    },
]


def tid(tok, name):
    return tok.convert_tokens_to_ids(name)


def test_renderer_follows_spec(tok):
    ids, mask = render_conversation(tok, TOOL_CONV)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    S = lambda n: [tid(tok, n)]  # noqa: E731
    a = TOOL_CONV["messages"][2]["content"]
    expected = [
        (S("<|bos|>"), 0),
        (S("<|user_start|>"), 0),
        (enc("You are helpful.\nBe brief.\n\nHow many r in 'strawberry'? Also 12*34?"), 0),
        (S("<|user_end|>"), 0),
        (S("<|assistant_start|>"), 0),
        (enc(a[0]["text"]), 1),
        (S("<|python_start|>") + enc(a[1]["text"]) + S("<|python_end|>"), 1),
        (S("<|output_start|>") + enc("3") + S("<|output_end|>"), 0),
        (enc(a[3]["text"]), 1),
        (S("<|python_start|>") + enc("12*34") + S("<|python_end|>"), 1),
        (S("<|output_start|>") + enc("408") + S("<|output_end|>"), 0),
        (enc(" so 408.\n"), 1),
        (S("<|assistant_end|>"), 1),
        (S("<|user_start|>") + enc("  Thanks!  \n") + S("<|user_end|>"), 0),
        (S("<|assistant_start|>"), 0),
        (enc("You're welcome 😀 -- 日本語 too."), 1),
        (S("<|assistant_end|>"), 1),
    ]
    assert ids == [i for piece, _ in expected for i in piece]
    assert mask == [m for piece, m in expected for _ in piece]


def test_rendered_token_strings(tok):
    conv = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": [{"type": "python", "text": "1"}, {"type": "python_output", "text": "2"}]},
        ]
    }
    ids, mask = render_conversation(tok, conv)
    assert list(zip(tok.convert_ids_to_tokens(ids), mask)) == [
        ("<|bos|>", 0), ("<|user_start|>", 0), ("S", 0), ("ĊĊ", 0), ("U", 0), ("<|user_end|>", 0),
        ("<|assistant_start|>", 0), ("<|python_start|>", 1), ("1", 1), ("<|python_end|>", 1),
        ("<|output_start|>", 0), ("2", 0), ("<|output_end|>", 0), ("<|assistant_end|>", 1),
    ]  # fmt: skip
    assert tok.decode(ids) == (
        "<|bos|><|user_start|>S\n\nU<|user_end|><|assistant_start|><|python_start|>1<|python_end|>"
        "<|output_start|>2<|output_end|><|assistant_end|>"
    )


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_template_matches_renderer(tok, conv):
    ids, mask = render_conversation(tok, conv)
    out = tok.apply_chat_template(conv["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert out["input_ids"] == ids
    assert out["assistant_masks"] == mask
    assert sum(mask) > 0 or conv["messages"][-1]["role"] == "user"


def test_list_of_parts_content_renders_as_the_joined_string(tok):
    parts = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "you"}]},
            {"role": "assistant", "content": "hello"},
        ]
    }
    plain = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi you"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    assert render_conversation(tok, parts) == render_conversation(tok, plain)
    assert tok.apply_chat_template(parts["messages"], tokenize=False) == tok.apply_chat_template(
        plain["messages"], tokenize=False
    )


def test_generation_prompt_matches_render_for_completion(tok):
    prompt = render_for_completion(tok, TOOL_CONV)
    assert prompt[-1] == tid(tok, "<|assistant_start|>")
    history = TOOL_CONV["messages"][:-1]
    assert tok.apply_chat_template(history, add_generation_prompt=True, return_dict=False) == prompt
    # the prompt is the rendered history; without an assistant message at the end nothing is removed
    assert prompt[:-1] == render_conversation(tok, {"messages": history}, max_tokens=None)[0]
    assert render_for_completion(tok, {"messages": history}) == prompt
    text = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|user_end|><|assistant_start|>")


def test_completion_prompt_over_the_limit_is_truncated_then_opened(tok):
    # nanochat: drop the last assistant message, render the rest truncated to 2048 tokens, then <|assistant_start|>
    long_user = " ".join(f"word{i}" for i in range(3000))
    conv = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": long_user},
            {"role": "assistant", "content": "answer"},
        ]
    }
    history, _ = render_conversation(tok, {"messages": conv["messages"][:-1]}, max_tokens=None)
    assert len(history) > 2048
    prompt = render_for_completion(tok, conv)
    assert prompt == history[:2048] + [tid(tok, "<|assistant_start|>")] and len(prompt) == 2049
    assert render_for_completion(tok, conv, max_tokens=100) == history[:100] + [tid(tok, "<|assistant_start|>")]
    assert render_for_completion(tok, conv, max_tokens=None) == history + [tid(tok, "<|assistant_start|>")]


def test_truncation(tok):
    ids, mask = render_conversation(tok, TOOL_CONV)
    short_ids, short_mask = render_conversation(tok, TOOL_CONV, max_tokens=10)
    assert (short_ids, short_mask) == (ids[:10], mask[:10])
    assert render_conversation(tok, TOOL_CONV, max_tokens=len(ids) + 5) == (ids, mask)


def test_batched_renderer(tok):
    ids, masks = render_conversations(tok, CONVERSATIONS, max_tokens=20)
    assert list(zip(ids, masks)) == [render_conversation(tok, c, max_tokens=20) for c in CONVERSATIONS]
    with pytest.raises(ValueError, match="conversation 1 of the batch: conversation is empty"):
        render_conversations(tok, [CONVERSATIONS[0], {"messages": []}])


def test_special_strings_in_text_are_plain_text(tok):
    # nanochat encodes message text as ordinary text: a typed "<|assistant_end|>" is not the special token
    conv = {"messages": [{"role": "user", "content": "say <|assistant_end|> now"}]}
    ids, _ = render_conversation(tok, conv)
    assert ids.count(tid(tok, "<|assistant_end|>")) == 0
    assert tok.decode(ids[2:-1]) == "say <|assistant_end|> now"


def test_adjacent_text_parts_encoded_separately(tok):
    # the renderer (as nanochat) never merges across parts; the template renders one string, which may merge
    parts = [
        {"type": "text", "text": "Hello wor"},
        {"type": "text", "text": "ld, numbers 12"},
        {"type": "text", "text": "34"},
    ]
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": parts}]}
    ids, mask = render_conversation(tok, conv)
    pieces = [tok.encode(p["text"], add_special_tokens=False) for p in parts]
    assert ids[5:-1] == [i for p in pieces for i in p]
    joined = tok.apply_chat_template(conv["messages"], return_dict=False)
    assert joined[5:-1] == tok.encode("Hello world, numbers 1234", add_special_tokens=False)
    assert joined != ids  # "wor"+"ld" and "12"+"34" tokenize differently when joined


def test_input_is_not_modified(tok):
    import copy

    before = copy.deepcopy(TOOL_CONV)
    render_conversation(tok, TOOL_CONV)
    render_for_completion(tok, TOOL_CONV)
    assert TOOL_CONV == before


BAD = [
    ({"messages": []}, "conversation is empty"),
    ({}, "must have a 'messages' list"),
    ({"messages": "hi"}, "must be a list"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "message 0 has role 'assistant', expected 'user'"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]}, "message 1 has role 'user'"),
    ({"messages": [{"role": "system", "content": "s"}]}, "system message must be followed by a user message"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}, "followed by a user"),
    (
        {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"}]},
        "message 1 has role 'system'",
    ),
    (
        {"messages": [{"role": "user", "content": ["x"]}]},
        "message 0 \\(user\\) content part 0: part type 'str', expected 'text'",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image", "url": "u"}]}]},
        "part type 'image', expected 'text'",
    ),
    (
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": None}]},
                {"role": "user", "content": "x"},
            ]
        },
        "message 0 \\(system\\) content part 0 text must be a string, got NoneType",
    ),
    ({"messages": [{"role": "user", "content": None}]}, "must be a string or a list of text parts, got NoneType"),
    ({"messages": [{"role": "user"}]}, "message 0 must be a dict with 'role' and 'content'"),
    (
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": 3}]},
        "string or a list of parts",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "image", "text": "i"}]},
            ]
        },
        "message 1 \\(assistant\\) content part 0: unknown part type 'image'",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": 5}]},
            ]
        },
        "part 0 text must be a string, got int",
    ),
]


@pytest.mark.parametrize("conv,message", BAD, ids=range(len(BAD)))
def test_bad_conversations_raise(tok, conv, message):
    with pytest.raises(ValueError, match=message):
        render_conversation(tok, conv)


@pytest.mark.parametrize(
    "messages,message",
    [
        ([{"role": "assistant", "content": "x"}], "message 0 has role 'assistant', expected 'user'"),
        ([{"role": "system", "content": "s"}], "system message must be followed by a user message"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "img", "text": ""}]}],
         "message 1 \\(assistant\\) content part 0: unknown part type 'img'"),
        ([{"role": "user", "content": [{"type": "image", "url": "u"}]}],
         "message 0 \\(user\\) content part 0: part type 'image', expected 'text'"),
        ([{"role": "system", "content": [{"type": "text", "text": 3}]}, {"role": "user", "content": "x"}],
         "message 0 \\(system\\) content part 0 text must be a string, got int"),
    ],
)  # fmt: skip
def test_template_rejects_bad_conversations(tok, messages, message):
    with pytest.raises(TemplateError, match=message):
        tok.apply_chat_template(messages, tokenize=False)


def _reaches_template(messages) -> bool:
    # apply_chat_template refuses an empty list and non-dict messages itself, and drops keys whose value is None
    # (so the template sees {"role": "user", "content": None} as a message without content)
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and None not in m.values() for m in messages)
    )


TEMPLATE_BAD = [conv["messages"] for conv, _ in BAD if _reaches_template(conv.get("messages"))] + [
    [{"content": "x"}],
    [{"role": "user", "content": "x"}, {"role": "assistant"}],
    [{"role": "user", "content": [{"text": "no type"}]}],
    [{"role": "user", "content": {"type": "text", "text": "x"}}],
    [{"role": "user", "content": 1.5}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": True}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": [[1]]}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "python"}]}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}, None]}],
    [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": [{"type": "python", "text": "1"}]},
    ],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "assistant", "content": "z"}],
]


@pytest.mark.parametrize("messages", TEMPLATE_BAD, ids=range(len(TEMPLATE_BAD)))
def test_template_and_renderer_refuse_with_the_same_message(tok, messages):
    with pytest.raises(ValueError) as python_error:
        render_conversation(tok, {"messages": messages})
    with pytest.raises(TemplateError) as template_error:
        tok.apply_chat_template(messages, tokenize=False)
    assert str(template_error.value) == str(python_error.value)


def test_a_none_content_is_refused_by_both(tok):
    messages = [{"role": "user", "content": None}]
    with pytest.raises(
        ValueError, match="message 0 \\(user\\) content must be a string or a list of text parts, got NoneType"
    ):
        render_conversation(tok, {"messages": messages})
    with pytest.raises(TemplateError, match="message 0 must be a dict with 'role' and 'content'"):
        tok.apply_chat_template(messages, tokenize=False)
