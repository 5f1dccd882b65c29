"""Every request is batched with the others, each with its own sampling and calculator: concurrent clients get
the text our generate() gives each request alone (greedy, and sampled with a seed), for G0, G4 (sliding windows,
value embeddings) and G5 (smear: each row's previous token), while their rows join and leave the batch. The
batcher in the server's process (``engine="thread"``), whose steps the test counts; test_engine.py has the same
requests through the model's own process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

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
# per request: max_tokens (30 crosses G4/G5's 9-key window; lengths differ so rows join and leave), sampling
REQUESTS = [
    (0, 30, {}),
    (1, 12, {"temperature": 1.0, "seed": 7}),
    (2, 25, {"temperature": 0.7, "seed": 3, "extra_body": {"top_k": 5}}),
    (3, 30, {}),
    (0, 20, {"temperature": 1.3, "seed": 11}),
    (1, 28, {}),
    (2, 9, {"temperature": 0.5, "seed": 0, "extra_body": {"top_k": 40}}),
    (3, 17, {"temperature": 1.0, "seed": 5}),
]


def record_batch_sizes(server) -> list[int]:
    """Rows of every decoding step the server's batcher runs from now on."""
    batcher, sizes = server.server.batcher, []
    decode = batcher._decode

    def counted() -> None:
        sizes.append(len(batcher.active))
        decode()

    batcher._decode = counted
    return sizes


def reference(server, question: int, max_tokens: int, options: dict) -> str:
    sampling = {k: v for k, v in options.items() if k != "extra_body"} | options.get("extra_body", {})
    return server.reference(QUESTIONS[question], max_tokens=max_tokens, **sampling)


def ask_all(server) -> list[str]:
    """REQUESTS sent together (the odd ones streamed); each reply's text."""

    def ask(i: int) -> str:
        question, max_tokens, options = REQUESTS[i]
        stream = i % 2 == 1
        reply = server.client.chat.completions.create(
            model=server.name, messages=QUESTIONS[question], max_tokens=max_tokens, stream=stream, **options
        )
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(ask, range(len(REQUESTS))))


@pytest.mark.parametrize("generation", ["g0", "g4", "g5"])
def test_concurrent_clients_each_get_generate_s_text(serve, model_dir, generation):
    server = serve(model_dir(generation), engine="thread")
    sizes = record_batch_sizes(server)
    assert ask_all(server) == [reference(server, *r) for r in REQUESTS]
    assert max(sizes) >= 4  # served together, not one after another


def test_each_request_has_its_own_calculator(serve, tool_model_dir):
    server = serve(tool_model_dir, engine="thread")
    sizes = record_batch_sizes(server)
    question = [{"role": "user", "content": "What is 2+3?"}]

    def ask(calculator: bool) -> str:
        reply = server.client.chat.completions.create(
            model=server.name, messages=question, max_tokens=12, extra_body={"calculator": calculator}
        )
        return reply.choices[0].message.content

    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(ask, [True, False] * 3))
    on, off = (server.reference(question, max_tokens=12, calculator=c) for c in (True, False))
    assert texts == [on, off] * 3
    assert on == "<<2+3=5>> ok" and off.startswith("<<2+3=?>>")
    assert max(sizes) >= 2
