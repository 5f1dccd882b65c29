"""The serve command: its module imports no server before parsing (so --help and bad arguments answer at once
once the package import is light), bad arguments and a bad model directory are one line, and the real command
serves the openai client until it is interrupted: one Ctrl-C stops it within seconds, generations in flight."""

from __future__ import annotations

import os
import signal
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

from .conftest import G0, free_port, openai, randomize, save_model

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
        "serve: error: --port must be positive, got -5 (see --help)\n",
    )
    for flag in ("--max-batch", "--max-queue", "--max-request-bytes", "--body-seconds"):
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


@pytest.mark.slow
def test_the_command_serves_until_interrupted(tmp_path):
    # a context of 4096 tokens: the two generations in flight would run for many seconds
    config = NanoChatGPTConfig(vocab_size=len(demo_tokenizer()), **{**G0, "sequence_len": 4096})
    folder = save_model(tmp_path / "long", randomize(NanoChatGPTForCausalLM(config)), demo_tokenizer())
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder), "--port", str(port), "--name", "tiny"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "no answer from the server"
                time.sleep(0.5)
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
        time.sleep(1)
    finally:
        began = time.monotonic()
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
    assert time.monotonic() - began < 10  # one Ctrl-C, generations in flight
    whole.join(timeout=10)
    assert ended == ["the server is shutting down"]
    said = server.stderr.read()
    assert "serve: http://127.0.0.1" in said and " of them idle now (/proc/stat over " in said, said
