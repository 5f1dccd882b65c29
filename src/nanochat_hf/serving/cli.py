"""Serve a nanochat-hf model (a directory written by training, the demo or ``convert``) with an OpenAI-compatible
chat completions endpoint.

    python -m nanochat_hf.serving MODEL_DIR [--port 8000] [--api-key KEY]

Then any OpenAI client: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY or "none").chat.completions
.create(model=NAME, messages=[...])`` (plain or ``stream=True``; ``max_tokens``, ``temperature``, ``top_k``,
``seed``, ``stop``; ``extra_body={"calculator": False}`` turns nanochat's calculator tool off for one request).
Concurrent requests are decoded together, each with its own settings. Greedy by default (temperature 0). NAME is
--name, by default the directory's name. The API key can also come from the NANOCHAT_API_KEY environment variable
(better: a command line is visible to every user of the machine). Needs the ``serve`` extra:
``pip install "nanochat-hf[serve]"``. docs/serving.md says what a request can ask and what is refused.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field, fields

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli

PROG = "serve"
API_KEY_VARIABLE = "NANOCHAT_API_KEY"
MAX_PORT = 65535


@dataclass
class ServeOptions:
    """What the ``serve`` command was given, and every default of the server (one place)."""

    model: str
    name: str | None = None  # default: the directory's name
    host: str = "127.0.0.1"  # loopback only
    port: int = 8000
    device: str | None = None  # default: cuda if available, else cpu
    dtype: str = "auto"  # as saved
    num_threads: int | None = None  # CPU: the cores idle when it starts (training.device, as every command)
    api_key: str | None = None  # default: $NANOCHAT_API_KEY; none: no authentication
    cors_origin: list[str] = field(default_factory=list)  # none: no CORS headers (browsers refuse other origins)
    max_request_bytes: int = 1_000_000  # a body over this is refused (413) before it is read whole
    max_batch: int = 32  # requests decoded together
    max_queue: int = 64  # requests waiting for a place in the batch; more get 429
    engine: str = "process"  # the model in a process of its own; "thread": in the server's process (engine.py)
    body_seconds: float = 30.0  # a body that takes longer to arrive is refused (408): slow clients hold no slot
    head_seconds: float = 10.0  # a connection whose request head takes longer (from its first byte) is closed
    no_calculator: bool = False
    no_page: bool = False  # the chat page at / (chat.html) is served unless this is set
    log_level: str = "warning"


DEFAULTS = {f.name: f.default for f in fields(ServeOptions) if f.name != "model"}
POSITIVE = ("max_request_bytes", "max_batch", "max_queue", "body_seconds", "head_seconds")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model directory (config, weights and tokenizer, as save_pretrained writes)")
    parser.add_argument("--name", help="the model name clients send (default: the directory's name)")
    parser.add_argument("--host", help="listen address (default: %(default)s, loopback only)")
    parser.add_argument("--port", type=int, help="default: %(default)s; 0: any free port (the one taken is said)")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], help="default: as saved")
    parser.add_argument(
        "--num-threads",
        "--num_threads",
        type=int,
        help="CPU threads, 1 to the cores (default: the cores idle when it starts, as mid_train)",
    )
    parser.add_argument(
        "--api-key",
        help=f"every endpoint but /health needs 'Authorization: Bearer KEY' (else 401); default: ${API_KEY_VARIABLE}",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        help="allow browser pages of this origin (e.g. http://localhost:3000; repeat for more); default: none",
    )
    parser.add_argument(
        "--max-request-bytes", type=int, help="refuse a larger request body with 413 (default: %(default)s)"
    )
    parser.add_argument("--max-batch", type=int, help="requests decoded together (default: %(default)s)")
    parser.add_argument(
        "--max-queue", type=int, help="requests waiting beyond the batch; more get 429 (default: %(default)s)"
    )
    parser.add_argument(
        "--body-seconds", type=float, help="refuse a body slower to arrive with 408 (default: %(default)s)"
    )
    parser.add_argument(
        "--head-seconds",
        type=float,
        help="close a connection whose request line and headers take longer to arrive (default: %(default)s)",
    )
    parser.add_argument(
        "--engine",
        choices=["process", "thread"],
        help="where the model runs: a process of its own (default: the model and HTTP share no GIL) or a thread of "
        "the server's process",
    )
    parser.add_argument("--no-calculator", action="store_true", help="calculator tool off unless a request asks")
    parser.add_argument("--no-page", action="store_true", help="no chat page at / (an API-only server: / is 404)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    add_version(parser)
    parser.set_defaults(**{k: v for k, v in DEFAULTS.items() if k != "cors_origin"})
    args = parser.parse_args(argv)
    args.cors_origin = args.cors_origin or []
    if not 0 <= args.port <= MAX_PORT:  # uvicorn would take 70000 as 70000 mod 65536
        parser.error(f"--port must be 1 to {MAX_PORT} (0: any free port), got {args.port}")
    for flag in POSITIVE:
        value = getattr(args, flag)
        if not value > 0:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {value:g}")
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_VARIABLE) or None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch and transformers are imported: --help and bad arguments answer at once

    def serve() -> None:
        try:
            from nanochat_hf.serving.server import start
        except ImportError as e:  # fastapi / uvicorn / openai missing
            raise UserError(f"{e.msg}: install the serve extra (pip install 'nanochat-hf[serve]')") from e
        server = start(ServeOptions(**vars(args)))
        try:
            server.run()
        except KeyboardInterrupt:  # Ctrl-C (uvicorn re-raises it once it has shut down): how a server is stopped
            pass
        exit_now(0)  # shut down: the model's process has ended, every connection is closed

    return run_cli(PROG, serve)


def exit_now(code: int) -> None:
    """End this process without the interpreter's teardown: with torch and transformers loaded it took seconds (at
    load 10: 7.8 s in the server's process, 3.7 s in the model's, most of a Ctrl-C that took 12 s there and 21-34 s
    at load 12), and nothing of ours needs it (no file open for writing; the logs and streams are flushed here)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
