"""nanochat's calculator tool in a served chat (same text as CalculatorToolProcessor through generate(), off on
request; a call without a result written as format_parts writes it), and bad requests: an HTTP 4xx with one line
saying what is wrong, no server path in it, while another client is served. The calculator with the batcher in the
server's process and in the model's own (``multiprocess``); the bad requests, refused before any generation, with
the batcher in the server's process. The servers are the session's shared ones (conftest's ``served``)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from .conftest import openai

QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module", params=["thread", pytest.param("process", marks=pytest.mark.multiprocess)])
def tool_server(request, served, tool_model_dir):
    return served(tool_model_dir, engine=request.param)


@pytest.fixture(scope="module")
def server(served, model_dir):
    return served(model_dir("g0"), engine="thread")


@pytest.mark.parametrize("stream", [False, True])
def test_the_calculator_s_output_is_inserted_and_generation_goes_on(tool_server, stream):
    reply = tool_server.client.chat.completions.create(
        model=tool_server.name, messages=QUESTION, max_tokens=20, stream=stream
    )
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in reply)
    else:
        text = reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"  # the model ended with <|assistant_end|>
    assert text == tool_server.reference(QUESTION, max_tokens=20) == "<<2+3=5>> ok"


def test_a_client_turns_the_calculator_off(tool_server):
    reply = tool_server.client.chat.completions.create(
        model=tool_server.name, messages=QUESTION, max_tokens=8, extra_body={"calculator": False}
    )
    text = reply.choices[0].message.content
    assert text == tool_server.reference(QUESTION, max_tokens=8, calculator=False)
    assert text.startswith("<<2+3=?>>") and "5" not in text  # the call is there, closed, with no result


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_closed_as_format_parts_closes_it(tool_server, stream):
    reply = tool_server.client.chat.completions.create(
        model=tool_server.name, messages=QUESTION, max_tokens=3, stream=stream
    )  # <|python_start|> 2 +
    text = "".join(c.choices[0].delta.content or "" for c in reply) if stream else reply.choices[0].message.content
    assert text == tool_server.reference(QUESTION, max_tokens=3) == "<<2+=?>>"


def post(server, body: bytes | None, path: str = "/v1/chat/completions", headers: dict | None = None):
    """(HTTP status, JSON answer) of a request to the server (GET without a body)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(server, **fields) -> bytes:
    return json.dumps({"model": server.name, "messages": QUESTION, **fields}).encode()


@pytest.mark.parametrize(
    "body, status, says",
    [
        (lambda s: b'{"model": "g0", "messages": [', 400, "not valid JSON"),
        (lambda s: chat(s, model="gpt-4o"), 404, "'gpt-4o' is not served here"),
        (
            lambda s: chat(s, messages=[{"role": "user", "content": "word " * 300}]),
            400,
            "context (sequence_len) is 128",
        ),
        (lambda s: chat(s, max_tokens=-1), 400, "max_tokens must be an integer from 1 to 128, got -1"),
        (lambda s: chat(s, temperature="hot"), 400, 'temperature must be a number from 0.0 to 2.0, got "hot"'),
        (lambda s: chat(s, messages=[]), 400, "messages must be a non-empty list"),
        (lambda s: chat(s, messages=[{"role": "assistant", "content": "hi"}]), 400, "message 0 has role 'assistant'"),
        (lambda s: chat(s, stop=[""]), 400, "stop must be a string or a list"),
        (lambda s: chat(s, stop=""), 400, "stop must be a string or a list"),
        (lambda s: chat(s, stop="x" * 101), 400, "strings of 1 to 100 characters"),
        (lambda s: chat(s, calculator="yes"), 400, "calculator must be true or false"),
        (lambda s: chat(s, colour="blue"), 422, "Unexpected fields in the request: {'colour'}"),
        (lambda s: b"[1, 2]", 400, "the request body must be a JSON object"),
        # prompt + max_tokens must fit the context (128): refused, not clipped
        (lambda s: chat(s, max_tokens=10**9), 400, "max_tokens must be an integer from 1 to 128, got 1000000000"),
        (lambda s: chat(s, max_tokens=120), 400, "exceed the model's context (sequence_len) 128: ask for at most"),
        (lambda s: chat(s, temperature=1e9), 400, "temperature must be a number from 0.0 to 2.0, got 1000000000.0"),
        (lambda s: chat(s, top_k=10**9), 400, "top_k must be an integer from 1 to 4096"),
        (lambda s: chat(s, seed=-1), 400, "seed must be an integer from 0 to"),
        (lambda s: chat(s, tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools is not supported"),
        (lambda s: chat(s, tool_choice="required"), 400, "tool_choice is not supported"),
        (lambda s: chat(s, response_format={"type": "json_object"}), 400, "response_format is not supported"),
        (lambda s: chat(s, logprobs=True), 400, "logprobs is not supported"),
        (lambda s: chat(s, presence_penalty=0.5), 400, "presence_penalty is not supported"),
        (lambda s: chat(s, top_p=0.9), 400, "top_p is not supported by this server (nanochat samples with"),
        (lambda s: chat(s, n=2), 400, "n is not supported"),
    ],
)
def test_bad_requests_get_a_4xx_with_one_line(server, body, status, says):
    code, answer = post(server, body(server))
    message = answer["error"]["message"]
    assert (code, says in message, "\n" in message) == (status, True, False), message
    assert str(server.folder.parent) not in message  # no path of the server's


def test_neutral_values_of_unsupported_fields_are_accepted(server):
    neutral = dict(tools=[], tool_choice="none", logprobs=False, presence_penalty=0, top_p=1, n=1, stop=None)
    code, answer = post(server, chat(server, max_tokens=3, **neutral))
    assert code == 200 and answer["usage"]["completion_tokens"] == 3


def test_a_conversation_far_over_the_context_is_refused_before_it_is_tokenized(server, monkeypatch):
    from nanochat_hf.serving import server as module

    def no_rendering(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(module, "render_for_completion", no_rendering)
    code, answer = post(server, chat(server, messages=[{"role": "user", "content": "word " * 150_000}]))
    message = answer["error"]["message"]
    assert code == 400 and message.startswith("the conversation is at least ")
    assert message.endswith(" tokens, the model's context (sequence_len) is 128")


def test_bad_requests_do_not_disturb_another_client(server):
    expected = server.reference(QUESTION, max_tokens=60)
    streamed = []

    def other_client() -> None:
        for chunk in server.client.chat.completions.create(
            model=server.name, messages=QUESTION, max_tokens=60, stream=True
        ):
            streamed.append(chunk.choices[0].delta.content or "")

    thread = threading.Thread(target=other_client)
    thread.start()
    for _ in range(3):
        assert post(server, b"{not json")[0] == 400
        assert post(server, chat(server, max_tokens=0))[0] == 400
        with pytest.raises(openai.NotFoundError):
            server.client.chat.completions.create(model="nope", messages=QUESTION)
    thread.join(timeout=120)
    assert "".join(streamed) == expected
    assert server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=5).choices[
        0
    ].message.content == server.reference(QUESTION, max_tokens=5)


def test_a_client_that_goes_away_does_not_disturb_the_next(server):
    stream = server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=100, stream=True)
    next(iter(stream))
    stream.close()  # the server stops generating for it (the streamer raises at its next token)
    reply = server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=7)
    assert reply.choices[0].message.content == server.reference(QUESTION, max_tokens=7)
