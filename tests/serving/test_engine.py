"""The model in a process of its own (``--engine process``, the default): concurrent requests get generate()'s text
and are decoded together; a client that goes away frees its place; the queue limit holds; a model process that
dies fails its requests and /health says so; weights that do not load are one line; a reply that cannot be written
ends only its own request. The long generations use a model whose context is a million tokens: a request that was not
stopped would hold its place for many minutes.

Every test here is about the model's own process (a spawned interpreter: ``multiprocess``). The servers that no test
changes are the session's shared ones (conftest's ``served``: one G0, one G5, one long-context server with a batch
and a queue of one); the one whose process is killed is its test's own."""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import signal
import socket
import threading
import time

import pytest

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data import demo_tokenizer
from nanochat_hf.errors import UserError
from nanochat_hf.inference import generate_tokens
from nanochat_hf.serving.batcher import Job
from nanochat_hf.serving.cli import ServeOptions
from nanochat_hf.serving.engine import EngineProcess
from nanochat_hf.serving.server import start

from .conftest import CHAT_HEAD, G0, openai, randomize, save_model, until
from .test_batcher import Collected, load
from .test_batching import REQUESTS, ask_all, reference
from .test_tool_and_bad_input import QUESTION, post

pytestmark = pytest.mark.multiprocess  # the model's process is what is tested


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    tokenizer = demo_tokenizer()
    config = NanoChatGPTConfig(vocab_size=len(tokenizer), **dict(G0, sequence_len=1_000_000))
    return save_model(tmp_path_factory.mktemp("long"), randomize(NanoChatGPTForCausalLM(config)), tokenizer)


@pytest.fixture(scope="module")
def long_server(served, long_dir):
    """One place in the batch and one in the queue: a long generation that was not stopped holds them."""
    return served(long_dir, max_batch=1, max_queue=1)


class Steps:
    """The engine's connection, counting the rows of each step's message from the model's process."""

    def __init__(self, conn):
        self.conn, self.rows = conn, []

    def recv(self):
        events = self.conn.recv()
        self.rows.append(sum(kind == "add" for _, kind, _ in events))
        return events

    def __getattr__(self, name):
        return getattr(self.conn, name)


@pytest.mark.parametrize("generation", ["g0", "g5"])
def test_concurrent_clients_get_generate_s_text_from_the_model_s_process(served, model_dir, generation):
    server = served(model_dir(generation))
    engine = server.server.batcher
    assert engine.process.is_alive()
    engine.conn = steps = Steps(engine.conn)
    try:
        assert ask_all(server) == [reference(server, *r) for r in REQUESTS]
    finally:
        engine.conn = steps.conn  # the shared server as it was
    assert max(steps.rows) >= 4  # one step's tokens for several rows: served together


def long_request(port: int, stream: bool) -> socket.socket:
    """A request for the rest of the context (a million tokens), sent on a connection left open."""
    body = json.dumps({"messages": QUESTION, "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"{CHAT_HEAD}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def answered(server) -> bool:
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=3)
    return reply.choices[0].message.content == server.reference(QUESTION, max_tokens=3)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_frees_its_place(long_server, stream):
    server = long_server
    engine = server.server.batcher
    with long_request(server.port, stream) as s:
        if stream:
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        until(lambda: engine.sinks)
        (sink,) = list(engine.sinks.values())
        time.sleep(0.2)  # generating
    until(lambda: sink.cancelled.is_set())  # the server has seen the client go
    # the model's process is told as the cancel is set (not a step later): its row is dropped at once, so a cancel
    # that never reaches it fails here in seconds, not after the wait below
    until(lambda: not engine.sinks, seconds=5)
    assert answered(server)  # the only place in the batch is free again: the long generation stopped


def test_a_full_queue_answers_429(long_server):
    server = long_server
    engine = server.server.batcher
    with long_request(server.port, True) as generating, long_request(server.port, True) as waiting:
        until(lambda: len(engine.sinks) == 2)
        with pytest.raises(openai.RateLimitError) as refused:
            server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=3)
        assert refused.value.message.endswith(" - the server is busy (its queue of 1 is full): try again later")
        assert generating and waiting
    until(lambda: not engine.sinks)
    assert answered(server)


class Late:
    """The engine's connection, whose end (the model's process gone) reaches the reader `seconds` late: the first
    instant after the process died, stretched."""

    def __init__(self, conn, seconds: float):
        self.conn, self.seconds = conn, seconds

    def recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            time.sleep(self.seconds)
            raise

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_a_model_process_that_dies_fails_its_requests_and_health_says_so(serve, long_dir, capfd):
    server = serve(long_dir)  # its own: its process is killed
    engine = server.server.batcher
    assert post(server, None, "/health")[0] == 200
    engine.conn = Late(engine.conn, 2)  # the reader takes it after its next message: the request's first step
    failed = []

    def ask() -> None:
        try:
            server.client.chat.completions.create(model=server.name, messages=QUESTION)
        except openai.APIStatusError as e:
            failed.append((e.status_code, e.message))

    asking = threading.Thread(target=ask)
    asking.start()
    until(lambda: engine.sinks and next(iter(engine.sinks.values())).tokens)  # one step read: Late in place
    os.kill(engine.process.pid, signal.SIGKILL)
    assert multiprocessing.connection.wait([engine.process.sentinel], 30)  # it has exited
    # before the reader has read the pipe's end, /health and a chat say the same (they said 200 and 500)
    gone = "the model's process has exited (the server's log says why)"
    assert post(server, None, "/health")[0] == 503
    with pytest.raises(openai.APIStatusError) as after:
        server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=3)
    assert after.value.status_code == 503 and gone in after.value.message
    assert engine.reader.is_alive() and not failed  # still the first instant
    asking.join(timeout=60)
    assert len(failed) == 1 and failed[0][0] == 500 and failed[0][1].endswith(f" - {gone}")
    assert post(server, None, "/health")[0] == 503
    with pytest.raises(openai.APIStatusError) as after:
        server.client.chat.completions.create(model=server.name, messages=QUESTION, max_tokens=3)
    assert after.value.status_code == 503 and gone in after.value.message
    assert "serve: the model's process exited (exit code -9)" in capfd.readouterr().err


def test_weights_that_do_not_load_are_one_line(model_dir, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in model_dir("g0").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(UserError) as e:
        start(ServeOptions(model=str(folder), port=0))  # bound before the model loads: any free port
    assert str(e.value).startswith(f"{folder}: could not load the model: ")
    assert "\n" not in str(e.value)


def test_a_reply_that_cannot_be_written_ends_only_its_own_request(served, model_dir, capfd):
    folder = model_dir("g0")
    model, tokenizer = load(folder)
    engine = served(folder).server.batcher  # the shared G0 server's model process
    assert isinstance(engine, EngineProcess)
    broken, fine = Collected(), Collected()
    broken.add = lambda new_tokens: 1 / 0
    prompt = tokenizer.encode("hello")
    for sink in (broken, fine):
        engine.submit(Job(prompt, 20, 0.0, None, None, True, sink))
    assert fine.done.wait(60) and fine.tokens == generate_tokens(model, tokenizer, [prompt], 20)[0]
    assert engine.alive() and not broken.done.is_set()
    assert "ZeroDivisionError" in capfd.readouterr().err
