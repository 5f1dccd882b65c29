"""The serve command: its module imports no server before parsing (so --help and bad arguments answer at once
once the package import is light), bad arguments and a bad model directory are one line, and the real command
serves the openai client until it is interrupted: one Ctrl-C stops it within seconds, generations in flight."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data import demo_tokenizer
from nanochat_hf.serving.cli import main, parse_args
from nanochat_hf.training.device import usable_cores

from .conftest import G0, openai, randomize, save_model

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve.py"


def test_the_command_module_imports_no_server_before_parsing():
    code = (
        "import sys; import nanochat_hf.serving.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'transformers', 'fastapi', 'uvicorn', 'openai', 'starlette'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["[]"], out.stdout + out.stderr


def test_help_and_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as shown:
        main(["--help"])
    out = capsys.readouterr().out
    assert shown.value.code == 0 and "--api-key" in out and "NANOCHAT_API_KEY" in out and "nanochat-hf[serve]" in out
    with pytest.raises(SystemExit) as bad:
        main([str(tmp_path), "--port", "-5"])
    assert (bad.value.code, capsys.readouterr().err) == (
        2,
        "serve: error: --port must be 1 to 65535 (0: any free port), got -5 (see --help)\n",
    )
    with pytest.raises(SystemExit):  # uvicorn would serve on 70000 mod 65536 = 4464
        main([str(tmp_path), "--port", "70000"])
    assert (
        capsys.readouterr().err
        == "serve: error: --port must be 1 to 65535 (0: any free port), got 70000 (see --help)\n"
    )
    for flag in ("--max-batch", "--max-queue", "--max-request-bytes", "--body-seconds", "--head-seconds"):
        with pytest.raises(SystemExit):
            main([str(tmp_path), flag, "0"])
        assert capsys.readouterr().err == f"serve: error: {flag} must be positive, got 0 (see --help)\n"
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"serve: error: {tmp_path}: no config.json here (expected a model directory written by save_pretrained)"
    ]


@pytest.mark.parametrize("requested", ["0", "10000"])
def test_a_thread_count_outside_one_to_the_cores_is_one_line(model_dir, capsys, requested):
    cores, model = len(usable_cores()), model_dir("g0")
    capsys.readouterr()  # the fixture's saving bar
    assert main([str(model), "--num-threads", requested]) == 2
    assert capsys.readouterr().err == (
        f"serve: error: --num-threads {requested}: expected 1 to {cores} (the CPU cores this process may use)\n"
    )


def test_a_port_in_use_or_an_address_not_here_is_one_line_before_the_model_loads(model_dir, capsys):
    model = str(model_dir("g0"))
    capsys.readouterr()  # the fixture's saving bar
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([model, "--port", str(port)]) == 2
        # one line, and nothing before it: the model's process was not started (it says its CPU threads first)
        assert capsys.readouterr().err == (
            f"serve: error: cannot listen on 127.0.0.1:{port} (Address already in use): see --host and --port\n"
        )
    for host, why in (("192.0.2.1", "Cannot assign requested address"), ("no-such-host.invalid", "")):
        assert main([model, "--host", host, "--port", "0"]) == 2
        said = capsys.readouterr().err
        assert said.startswith(f"serve: error: cannot listen on {host}:0 ({why}") and said.count("\n") == 1, said


def test_the_api_key_comes_from_the_environment_unless_given(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_API_KEY", "from-env")
    assert parse_args([str(tmp_path)]).api_key == "from-env"
    assert parse_args([str(tmp_path), "--api-key", "given"]).api_key == "given"
    monkeypatch.delenv("NANOCHAT_API_KEY")
    assert parse_args([str(tmp_path)]).api_key is None


def ask_long(client) -> str:
    try:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        return "finished"
    except openai.APIStatusError as e:
        return e.body["message"] if isinstance(e.body, dict) else str(e.body)


def announced_port(server: subprocess.Popen, said: list[str], seconds: float = 240) -> int:
    """The port of the server's "serves http://127.0.0.1:PORT/v1" line (its stderr read into `said` by a thread)."""

    def read() -> None:
        for line in server.stderr:
            said.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + seconds
    while True:
        for line in said:
            if found := re.match(r"serve: http://127\.0\.0\.1:(\d+)/v1 ", line):
                return int(found[1])
        assert server.poll() is None and time.monotonic() < deadline, "".join(said)
        time.sleep(0.1)


@pytest.mark.slow
def test_the_command_serves_until_interrupted(tmp_path):
    # a context of 4096 tokens: the two generations in flight would run for many seconds
    config = NanoChatGPTConfig(vocab_size=len(demo_tokenizer()), **{**G0, "sequence_len": 4096})
    folder = save_model(tmp_path / "long", randomize(NanoChatGPTForCausalLM(config)), demo_tokenizer())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder), "--port", "0", "--name", "tiny"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    idle = []  # connections open and doing nothing: one after a request (keep-alive), one in the middle of a head
    try:
        port = announced_port(server, said)  # the free port it took (--port 0), said once it listens
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
            assert r.status == 200
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
        streamed = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        next(iter(streamed))
        ended = []  # a whole (not streamed) reply in flight too: it gets an error when the server stops
        whole = threading.Thread(target=lambda: ended.append(ask_long(client)), daemon=True)
        whole.start()
        for head in (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /hea"):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            idle[-1].sendall(head)
        assert idle[0].recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1)
    finally:
        began = time.monotonic()
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
        took = time.monotonic() - began
        for s in idle:
            s.close()
    # one Ctrl-C, generations in flight, idle connections: it took 12 s at load 10 (21-34 s at load 12) while the
    # interpreter tore torch down in both processes; now under a second
    assert took < 5, took
    whole.join(timeout=10)
    assert ended == ["the server is shutting down"]
    text = "".join(said)
    assert f"serve: http://127.0.0.1:{port}/v1 serves 'tiny'" in text and " of them idle now (/proc/stat over " in text
    assert "Traceback" not in text and "leaked" not in text, text
