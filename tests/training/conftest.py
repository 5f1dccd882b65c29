"""Fixtures for the training tests: tiny run settings, and a local stand-in for the Hugging Face Hub.

The hub server speaks just enough of the hub's HTTP API for huggingface_hub's create_repo / upload_folder
(preupload + commit, regular uploads only) and hf_hub_download (HEAD/GET resolve), reached via HF_ENDPOINT.
It listens on 127.0.0.1 only, keeps repos in memory, caps request bodies and is shut down after the test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_BODY = 256 * 1024 * 1024

# A run small enough for CI: tiny model, short sequences, a handful of steps on the demo mixture.
TINY_ARGS = [
    "--model_source",
    "demo",
    "--demo_depth",
    "2",
    "--max_seq_len",
    "64",
    "--device_batch_size",
    "2",
    "--total_batch_size",
    "256",
    "--eval_every",
    "4",
    "--eval_tokens",
    "512",
    "--spelling_eval_rows",
    "4",
    "--report_to",
    "none",
    "--disable_tqdm",
    "true",
    "--chat_eval_tasks",
    "",
    "--torch_compile",
    "false",  # the demo config compiles; tests stay eager (compiling costs more than they run)
]


class HubState:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: dict[str, str] = {}
        self.requests: list[str] = []
        self.auth_headers: list[str] = []
        self.lock = threading.Lock()


def _make_handler(state: HubState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, code: int, obj, headers: dict | None = None):
            self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise ValueError("request body too large")
            return self.rfile.read(n)

        def _record(self):
            with state.lock:
                state.requests.append(f"{self.command} {self.path}")
                if self.headers.get("Authorization"):
                    state.auth_headers.append(self.headers["Authorization"])

        def do_POST(self):
            self._record()
            body = self._body()
            path = self.path.split("?")[0]
            if path == "/api/validate-yaml":  # model card metadata check
                return self._json(200, {"errors": [], "warnings": []})
            if path == "/api/repos/create":
                req = json.loads(body)
                repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                with state.lock:
                    state.repos.setdefault(repo_id, {})
                    state.commits.setdefault(repo_id, "0" * 40)
                return self._json(200, {"url": f"http://{self.headers['Host']}/{repo_id}", "name": repo_id})
            m = re.fullmatch(r"/api/models/(.+?)/(preupload|commit)/([^/]+)", path)
            if not m or m.group(1) not in state.repos:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            repo_id, kind = m.group(1), m.group(2)
            if kind == "preupload":
                files = json.loads(body)["files"]
                return self._json(
                    200,
                    {
                        "files": [
                            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                            for f in files
                        ]
                    },
                )
            with state.lock:
                files = state.repos[repo_id]
                for line in body.decode().splitlines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    elif item["key"] == "deletedFile":
                        files.pop(item["value"]["path"], None)
                    elif item["key"] not in ("header",):
                        return self._json(400, {"error": f"unsupported commit item {item['key']}"})
                digest = hashlib.sha1(
                    repr(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items())).encode()
                ).hexdigest()
                state.commits[repo_id] = digest
            return self._json(
                200,
                {
                    "commitUrl": f"http://{self.headers['Host']}/{repo_id}/commit/{digest}",
                    "commitOid": digest,
                    "pullRequestUrl": None,
                },
            )

        def _resolve(self, head: bool):
            self._record()
            path = self.path.split("?")[0]
            tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?(.*)", path)
            if tree and tree.group(1) in state.repos:  # list a folder (transformers looks for chat templates)
                prefix = tree.group(3).rstrip("/") + "/" if tree.group(3) else ""
                entries = [
                    {"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                    for f, d in sorted(state.repos[tree.group(1)].items())
                    if f.startswith(prefix)
                ]
                if prefix and not entries:
                    return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                return self._json(200, entries)
            m = re.fullmatch(r"/(?:api/models/)?([^/]+/[^/]+)(?:/resolve/([^/]+)/(.+)|/revision/([^/]+)|)", path)
            if not m or m.group(1) not in state.repos:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            repo_id, files = m.group(1), state.repos[m.group(1)]
            if m.group(3) is None:  # model_info
                return self._json(
                    200,
                    {
                        "id": repo_id,
                        "sha": state.commits[repo_id],
                        "private": False,
                        "siblings": [{"rfilename": f} for f in sorted(files)],
                    },
                )
            name = m.group(3)
            if name not in files:
                return self._send(
                    404,
                    b"Entry not found",
                    {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": state.commits[repo_id]},
                    head,
                )
            data = files[name]
            headers = {
                "X-Repo-Commit": state.commits[repo_id],
                "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                "Content-Type": "application/octet-stream",
            }
            return self._send(200, data, headers, head)

        def do_HEAD(self):
            self._resolve(head=True)

        def do_GET(self):
            self._resolve(head=False)

    return Handler


@contextmanager
def serve_hub():
    """(endpoint URL, HubState) of a local in-memory hub on 127.0.0.1, stopped on leaving."""
    state = HubState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def hub_server():
    """(endpoint URL, HubState) of a local hub (serve_hub), stopped after the test."""
    with serve_hub() as hub:
        yield hub


HUB_SECRET = "hf_localtestsecret0123456789abcdef"  # the token the local hub's clients send: never printed or written
HUB_REPO = "alice/tiny-mid"


@pytest.fixture(scope="session")
def pushed_run(tmp_path_factory):
    """A short scripts/mid_train.py run in a fresh process (4 steps, saved at steps 2 and 4) pushing to a local hub
    (serve_hub, kept up for the tests) with hub_strategy checkpoint: what it prints and writes is test_run.py's, what
    it pushes test_hub.py's. Namespace of state (the hub's), proc (CompletedProcess), out (its output folder), env (the
    hub's variables it ran with), tmp (the folder it ran in)."""
    with serve_hub() as (endpoint, state):
        tmp = tmp_path_factory.mktemp("pushed")
        env = {
            "HF_ENDPOINT": endpoint,
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": HUB_SECRET,
            "HF_HOME": str(tmp / "hf"),
            "HF_HUB_DISABLE_XET": "1",
        }
        out = tmp / "out"
        args = ["--num_iterations", "4", "--save_steps", "2", "--output_dir", str(out), "--push_to_hub", "true",
                "--hub_model_id", HUB_REPO, "--hub_strategy", "checkpoint"]  # fmt: skip
        proc = run_script([*TINY_ARGS, *args], tmp, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield SimpleNamespace(state=state, proc=proc, out=out, env=env, tmp=tmp)


@pytest.fixture(scope="module")
def module_hub_server():
    """serve_hub for the tests of one module: a push shared by several tests' assertions."""
    with serve_hub() as hub:
        yield hub


def run_script(args: list[str], tmp_path: Path, env: dict | None = None, timeout: int = 240):
    """Run scripts/mid_train.py in a fresh single process; returns CompletedProcess."""
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "NANOCHAT_HF_CACHE": os.environ.get("NANOCHAT_HF_CACHE", str(Path.home() / ".cache" / "nanochat_hf")),
        **(env or {}),
    }
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "mid_train.py"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tiny_args():
    return list(TINY_ARGS)


@pytest.fixture
def run_mid_train():
    return run_script


def answer(parse, argv: list[str], capsys) -> tuple[object, str, str]:
    """(exit code or None if parsing went on, stdout, stderr) of `parse(argv)`."""
    try:
        parse(list(argv))
        code = None
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def checkpoint_requested_at(monkeypatch, run_module, step: int) -> None:
    """The Trainer `run_module.build_trainer` builds is asked for its JIT checkpoint at the start of `step` (what
    transformers' SIGTERM handler sets once its grace period is over), without a signal or its 3 s wait."""
    from transformers import TrainerCallback

    from nanochat_hf.training.callbacks import StepEndJITCheckpoint

    class Sigterm(TrainerCallback):
        def __init__(self, manager):
            self.manager = manager

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == step:
                self.manager.is_checkpoint_requested = True

    original = run_module.build_trainer

    def build_trainer(*a, **k):
        trainer = original(*a, **k)
        (jit,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, StepEndJITCheckpoint)]
        trainer.add_callback(Sigterm(jit.jit_manager))
        return trainer

    monkeypatch.setattr(run_module, "build_trainer", build_trainer)
