"""The official openai client against the real server: the same greedy text as our generate() with the chat
template on the same messages, plain and streaming, multi-turn; no special token in the text; max_tokens,
temperature and stop honoured. For a G0 and a G5 model (demo tokenizer, random weights), each served with the
batcher in the server's process (quick) and in the model's own process (the default, ``multiprocess``: the reply's
tokens and a stop string's end cross between the processes), and a G5 model that nanochat HEAD trained, converted
from its files. The servers are the session's shared ones (conftest's ``served``)."""

from __future__ import annotations

from pathlib import Path

import pytest

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


# the model's own process: a spawned interpreter (started once for the session, shared with test_engine.py)
ENGINES = ["thread", pytest.param("process", marks=pytest.mark.multiprocess)]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    return request.param


@pytest.fixture(scope="module", params=["g0", "g5"])
def server(request, served, model_dir, engine):
    return served(model_dir(request.param), engine=engine)


def ask(server, messages, stream=False, **options):
    """(content, finish_reason, completion_tokens) of one chat completion."""
    if not stream:
        reply = server.client.chat.completions.create(model=server.name, messages=messages, **options)
        return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.completion_tokens
    chunks = list(server.client.chat.completions.create(model=server.name, messages=messages, stream=True, **options))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    return text, chunks[-1].choices[0].finish_reason, chunks[-1].usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("turns", [2, 4])
def test_greedy_text_is_generate_s(server, stream, turns):
    messages = CHAT[:turns]
    expected = server.reference(messages, max_tokens=40)
    text, finish, n = ask(server, messages, stream=stream, max_tokens=40)
    assert text == expected
    assert "<|" not in text and "|>" not in text  # no special token leaks
    assert (finish, n) == ("length", 40)  # a random model does not stop by itself within 40 tokens


def test_server_renders_as_the_chat_template(server):
    """The server renders with our renderer; the saved tokenizer's chat template gives the same prompt ids."""
    from nanochat_hf.tokenizer import render_for_completion

    template = server.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert render_for_completion(server.tokenizer, {"messages": CHAT}, max_tokens=None) == template


def test_max_tokens_and_sampling(server):
    short, finish, n = ask(server, CHAT, max_tokens=3)
    assert (finish, n) == ("length", 3)
    assert server.reference(CHAT, max_tokens=40).startswith(short)
    sampled = [ask(server, CHAT, max_tokens=20, temperature=1.0, seed=7)[0] for _ in range(2)]
    assert sampled[0] == sampled[1] == server.reference(CHAT, max_tokens=20, temperature=1.0, seed=7)
    assert sampled[0] != server.reference(CHAT, max_tokens=20)  # sampling took place


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_text_before_them(server, stream):
    full = server.reference(CHAT, max_tokens=40)
    stop = full[12:15]
    text, finish, n = ask(server, CHAT, stream=stream, max_tokens=40, stop=[stop, "never written"])
    assert (text, finish) == (full[: full.index(stop)], "stop")
    assert n < 40  # generation stopped there


CHAIN = Path(__file__).resolve().parents[1] / "training" / "data" / "chain" / "nanochat"


def test_a_g5_model_converted_from_nanochat_files(serve, tmp_path):
    """A G5 base model that nanochat HEAD's base_train wrote (tests/training/data/chain, see the README there),
    converted with from-nanochat and served: the client gets generate()'s greedy text, plain and streamed. The
    batcher in the server's process: what is checked is the converted model (G5 through the model's own process is
    test_engine.py's)."""
    from nanochat_hf.conversion import from_nanochat

    folder = from_nanochat(
        CHAIN / "base_checkpoints" / "d4", tmp_path / "nanochat-g5", CHAIN / "tokenizer", trust_pickle=True
    )
    server = serve(folder, engine="thread")
    assert server.model.config.smear and server.model.config.backout  # G5
    for turns in (2, 4):
        expected = server.reference(CHAT[:turns], max_tokens=24)
        for stream in (False, True):
            text, _, n = ask(server, CHAT[:turns], stream=stream, max_tokens=24)
            assert text and text == expected and n <= 24, (text, expected)
            assert "<|" not in text and "|>" not in text
