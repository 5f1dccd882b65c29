"""What keeps the server safe to leave running: the API key, only the documented endpoints, CORS only when asked,
a warning when it listens beyond loopback without a key, bodies limited in size and time, a queue limit, clients
that go away stop their generation. Every refusal is one line; the server goes on serving after each.

All of it is the HTTP layer's (the guard, uvicorn's protocol, the request checks) or the batcher's, whichever
process the batcher runs in: the servers here run it in the server's process (``engine="thread"``, no interpreter
to spawn), shared for the session where the test changes nothing (conftest's ``served``). test_engine.py has the
queue limit and a departed client's cancel through the model's own process."""

from __future__ import annotations

import json
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nanochat_hf.serving import server as server_module
from nanochat_hf.serving.cli import ServeOptions
from nanochat_hf.serving.server import listen, start

from .conftest import CHAT_HEAD, openai, until
from .test_tool_and_bad_input import QUESTION, chat, post

KEY = "s3cret-key"


def raw(port: int, data: bytes, wait: float = 30) -> bytes:
    """What the server answers to these bytes (sent as they are), until it closes or `wait` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and answer.split(b"\r\n\r\n", 1)[1].rstrip().endswith(b"}"):
                    break
        except TimeoutError:
            pass
        return answer


def slow_down(server, seconds: float) -> None:
    """Every forward of the served model takes `seconds` longer (so that a generation is still running)."""
    model = server.server.batcher.model
    forward = model.forward

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    model.forward = slow


def works(server) -> bool:
    reply = server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=3)
    return reply.usage.completion_tokens == 3


@pytest.fixture(scope="module")
def plain(served, model_dir):
    return served(model_dir("g0"), engine="thread")


@pytest.fixture(scope="module")
def guarded(served, model_dir):
    options = dict(api_key=KEY, max_request_bytes=10_000, body_seconds=1.0, head_seconds=1.0, engine="thread")
    return served(model_dir("g0"), **options)


def test_the_api_key_guards_every_endpoint_but_health(guarded):
    assert post(guarded, None, "/health")[0] == 200
    for path, body in (("/v1/models", None), ("/v1/chat/completions", chat(guarded))):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            code, answer = post(guarded, body, path, headers)
            assert (code, answer["error"]["message"]) == (
                401,
                "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
            )
    with pytest.raises(openai.AuthenticationError):
        guarded.client.models.list()  # the fixture's client sends api_key="none"
    client = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [guarded.name]
    reply = client.chat.completions.create(model=guarded.name, messages=QUESTION, max_tokens=4)
    assert reply.choices[0].message.content == guarded.reference(QUESTION, max_tokens=4)


def test_the_api_key_guards_streamed_requests_too(guarded):
    """The official client streaming: a wrong key and no key at all are refused before anything is streamed."""
    wrong = openai.OpenAI(base_url=guarded.url, api_key="wrong", max_retries=0, timeout=60)
    no_key = {"Authorization": openai.Omit()}  # the header left out
    for client, headers in ((wrong, None), (wrong, no_key), (guarded.client, None)):  # the fixture's: "none"
        with pytest.raises(openai.AuthenticationError) as refused:
            client.chat.completions.create(
                model=guarded.name, messages=QUESTION, max_tokens=4, stream=True, extra_headers=headers
            )
        assert refused.value.message.endswith(
            " - a valid API key is needed: send the header 'Authorization: Bearer KEY'"
        ), refused.value.message
    right = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0, timeout=60)
    chunks = list(right.chat.completions.create(model=guarded.name, messages=QUESTION, max_tokens=4, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == guarded.reference(QUESTION, max_tokens=4) and chunks[-1].usage.completion_tokens == 4


@pytest.mark.parametrize(
    "path",
    [
        "/load_model",
        "/reset",
        "/v1/completions",
        "/v1/responses",
        "/v1/audio/transcriptions",
        "/v1/systemone",
        "/docs",
        "/openapi.json",
    ],
)
def test_only_the_documented_endpoints_are_served(plain, path):
    server = plain
    for body in (json.dumps({"model": "/etc", "prompt": "hi"}).encode(), None):
        code, answer = post(server, body, path)
        assert (code, answer["error"]["message"]) == (
            404,
            "no such endpoint: this server serves /v1/chat/completions, /v1/models, /health",
        )
    assert works(server)


def test_cors_headers_only_for_the_origins_asked(served, model_dir, plain):
    origin = {"Origin": "http://localhost:3000"}
    asked = served(model_dir("g0"), cors_origin=["http://localhost:3000"], api_key=KEY, engine="thread")

    def allowed(server, method: str, headers: dict) -> str | None:
        request = f"{method} /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        request += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = raw(server.port, (request + "\r\n").encode()).split(b"\r\n\r\n")[0].decode().lower()
        lines = [line for line in head.splitlines() if line.startswith("access-control-allow-origin:")]
        return lines[0].split(": ", 1)[1] if lines else None

    assert allowed(plain, "GET", origin) is None
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    assert allowed(asked, "OPTIONS", preflight) == "http://localhost:3000"  # a preflight carries no key
    assert allowed(asked, "GET", {**origin, "Authorization": f"Bearer {KEY}"}) == "http://localhost:3000"
    assert allowed(asked, "GET", {"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"}) is None


@pytest.mark.parametrize(
    "kind", ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]
)
def test_a_post_that_is_not_json_is_refused_unread(plain, kind):
    """What a web page of any origin may POST without a CORS preflight (a "simple" request: the browser sends it
    and only hides the answer) starts no generation: 415, before the body is read, and the connection is closed."""
    body = json.dumps({"model": plain.name, "messages": QUESTION, "max_tokens": 3}).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\n"
    head += f"Content-Type: {kind}\r\n" if kind else ""
    answer = raw(plain.port, f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = repr(kind.split(";")[0]) if kind else "none"
    assert answer.startswith(b"HTTP/1.1 415") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"] == (
        f"the request body must be JSON, sent with 'Content-Type: application/json' (got {got})"
    )
    assert b"connection: close" in answer.lower()
    assert works(plain)


@pytest.mark.parametrize(
    "host, api_key, warned", [("0.0.0.0", None, True), ("0.0.0.0", KEY, False), ("127.0.0.1", None, False)]
)
def test_listening_beyond_loopback_without_a_key_warns_in_one_line(
    model_dir, capfd, monkeypatch, host, api_key, warned
):
    monkeypatch.setattr(server_module, "listen", lambda host, port: listen("127.0.0.1", 0))  # the test's on loopback
    server = start(ServeOptions(model=str(model_dir("g0")), host=host, port=0, api_key=api_key, engine="thread"))
    server.batcher.stop()
    server.socket.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    expected = "serve: warning: listening on 0.0.0.0 without an API key: anyone who can reach it can use it (--api-key)"
    assert lines == ([expected] if warned else [])


def test_a_body_over_the_limit_is_refused_before_it_is_read(guarded):
    auth = f"Authorization: Bearer {KEY}\r\n"
    # 50 MB announced, none sent: the answer comes at once, so nothing was waited for
    head = f"{CHAT_HEAD}{auth}Content-Length: 50000000\r\n\r\n"
    began = time.monotonic()
    answer = raw(guarded.port, head.encode())
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - began < 10
    message = "the request body is larger than this server takes (10000 bytes, --max-request-bytes)"
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"] == message
    # chunked, no length announced: refused once the limit is passed
    chunk = b"x" * 4000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
    head = f"{CHAT_HEAD}{auth}Transfer-Encoding: chunked\r\n\r\n"
    answer = raw(guarded.port, head.encode() + body)
    assert answer.startswith(b"HTTP/1.1 413") and message.encode() in answer


@pytest.mark.slow
def test_a_slow_body_is_refused_and_blocks_nobody(guarded):
    """Slow: a body that stops must outlast the body timeout (seconds)."""
    head = f"{CHAT_HEAD}Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(raw, guarded.port, head.encode() + b'{"model"')  # 8 of 100 bytes, then nothing
        client = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=guarded.name, messages=QUESTION, max_tokens=3)
        assert reply.usage.completion_tokens == 3 and not slow.done()  # served while the slow body waits
        answer = slow.result()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"the request body did not arrive within 1 s" in answer


def closed_after(s: socket.socket, trickle: bytes, limit: int = 10) -> float | None:
    """Seconds until the server closes `s` while `trickle` is sent to it a byte a second (None: still open after
    `limit` seconds)."""
    began = time.monotonic()
    for byte in trickle[:limit]:
        try:
            s.sendall(bytes([byte]))
            ready, _, _ = select.select([s], [], [], 1.0)
            if ready and s.recv(65536) == b"":
                return time.monotonic() - began
        except OSError:  # reset: closed
            return time.monotonic() - began
    return None


@pytest.mark.slow
def test_a_slow_head_is_closed_and_blocks_nobody(guarded):
    """Slow: a header sent a byte a second must outlast the header timeout (seconds)."""
    head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
    with ThreadPoolExecutor(2) as pool:
        with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as new:
            slow = pool.submit(closed_after, new, head)  # a byte a second from the start
            with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as kept:
                kept.sendall(head)  # a whole request, answered; then the next head a byte a second
                assert kept.recv(65536).startswith(b"HTTP/1.1 200")
                again = pool.submit(closed_after, kept, head)
                client = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0, timeout=60)
                reply = client.chat.completions.create(model=guarded.name, messages=QUESTION, max_tokens=3)
                assert reply.usage.completion_tokens == 3  # served meanwhile
                for closed in (slow.result(), again.result()):  # head_seconds is 1
                    assert closed is not None and closed < 4, closed
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as silent:  # nothing at all
        ready, _, _ = select.select([silent], [], [], 4)
        assert ready and silent.recv(65536) == b""


@pytest.mark.slow
def test_a_full_queue_answers_429(serve, model_dir):
    """Slow: the queue is held full by generation slowed for seconds, so that the next request finds it full."""
    server = serve(model_dir("g0"), max_batch=1, max_queue=1, engine="thread")
    slow_down(server, 0.05)

    def ask(_) -> int:
        try:
            server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=40)
            return 200
        except openai.RateLimitError as e:
            assert e.message.endswith(" - the server is busy (its queue of 1 is full): try again later")
            return 429

    batcher = server.server.batcher
    with ThreadPoolExecutor(2) as pool:
        generating = pool.submit(ask, 0)
        until(lambda: batcher.active)
        waiting = pool.submit(ask, 1)
        until(lambda: batcher.waiting)
        refused = [ask(2), ask(3)]  # while one generates and one waits
        assert (generating.result(), waiting.result(), refused) == (200, 200, [429, 429])
    assert works(server)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_stops_its_generation(serve, model_dir, stream):
    server = serve(model_dir("g0"), engine="thread")
    slow_down(server, 0.02)
    batcher, jobs = server.server.batcher, []
    submit = batcher.submit
    batcher.submit = lambda job: (jobs.append(job), submit(job))[1]
    body = json.dumps({"messages": QUESTION, "max_tokens": 100, "stream": stream}).encode()
    head = f"{CHAT_HEAD}Content-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head + body)
        deadline = time.monotonic() + 30
        while not (jobs and len(jobs[0].sink.tokens) >= 5):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    gone = len(jobs[0].sink.tokens)  # the client closed its connection here
    while batcher.active:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(jobs[0].sink.tokens) <= gone + 3 < 100  # stopped within a few steps (one is 20 ms or more)
    assert works(server)


def test_a_client_gone_before_its_body_is_in_leaves_no_trace(guarded, capfd):
    head = f"{CHAT_HEAD}Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n"
    with socket.create_connection(("127.0.0.1", guarded.port)) as s:
        s.sendall(head.encode() + b'{"mess')
    time.sleep(0.5)
    client = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0, timeout=60)
    assert (
        client.chat.completions.create(model=guarded.name, messages=QUESTION, max_tokens=3).usage.completion_tokens == 3
    )
    assert "Traceback" not in capfd.readouterr().err
