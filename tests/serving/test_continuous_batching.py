"""--continuous-batching: transformers' paged-attention batching gives generate()'s greedy text for concurrent
clients (G0; G4 with sliding windows, value embeddings and G5's backout); a G5 model (smear) is served one request
at a time, said in one line at start."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from nanochat_hf.serving.server import ServeOptions, start

from .test_tool_and_bad_input import post

QUESTIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ],
    [{"role": "user", "content": "Tell me a story about a dragon and a knight."}],
    [{"role": "user", "content": "hi"}],
]


@pytest.fixture(scope="module", params=["g0", "g4"])
def server(request, serve, model_dir):
    return serve(model_dir(request.param), continuous_batching=True)


def test_concurrent_clients_get_generate_s_greedy_text(server):
    # 30 tokens: past the G4 model's 9-key window; lengths differ so that requests join and leave the batch
    lengths = [30, 12, 25, 30]

    def ask(i: int, stream: bool) -> str:
        reply = server.client.chat.completions.create(
            model=server.name, messages=QUESTIONS[i], max_tokens=lengths[i], stream=stream
        )
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, [0, 1, 2, 3] * 2, [False] * 4 + [True] * 4))
    expected = [server.reference(q, max_tokens=n) for q, n in zip(QUESTIONS, lengths)]
    assert texts == expected * 2


def test_what_batching_cannot_do_is_refused_in_one_line(server):
    for field, value in (("temperature", 0.7), ("calculator", True)):
        body = json.dumps({"messages": QUESTIONS[0], field: value}).encode()
        code, answer = post(server, body)
        assert code == 400 and "not available with continuous batching" in answer["error"]["message"]


def test_a_g5_model_is_served_without_batching_and_says_so(model_dir, capfd):
    server = start(ServeOptions(model=str(model_dir("g5")), port=0, continuous_batching=True))
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("serve: ")]
    assert lines[0].startswith("serve: continuous batching off: this model's smear (nanochat G5)")
    assert not server.state._continuous_batching
