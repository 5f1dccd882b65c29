"""Serve a nanochat-hf model (a directory written by training, the demo or ``convert``) with an OpenAI-compatible
chat completions endpoint, on transformers' server.

    python -m nanochat_hf.serving MODEL_DIR [--port 8000] [--continuous-batching]

Then any OpenAI client: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").chat.completions.create(
model=NAME, messages=[...])`` (plain or ``stream=True``; ``max_tokens``, ``temperature``, ``top_k``, ``seed``,
``stop``; ``extra_body={"calculator": False}`` turns nanochat's calculator tool off for one request). Greedy by
default (temperature 0). NAME is --name, by default the directory's name. Needs the ``serve`` extra:
``pip install "nanochat-hf[serve]"``.
"""

from __future__ import annotations

import argparse

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli

PROG = "serve"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model directory (config, weights and tokenizer, as save_pretrained writes)")
    parser.add_argument("--name", default=None, help="the model name clients send (default: the directory's name)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="default: as saved")
    parser.add_argument(
        "--num-threads",
        "--num_threads",
        type=int,
        default=None,
        help="CPU threads, 1 to the cores (default: the cores idle when it starts, as mid_train)",
    )
    parser.add_argument(
        "--continuous-batching",
        action="store_true",
        help="serve concurrent requests together with transformers' paged attention (greedy, no calculator)",
    )
    parser.add_argument("--cb-num-blocks", type=int, default=None, help="paged cache blocks (default: fit the model)")
    parser.add_argument("--cb-max-batch-tokens", type=int, default=None, help="tokens per continuous batch")
    parser.add_argument("--no-calculator", action="store_true", help="calculator tool off unless a request asks")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    add_version(parser)
    args = parser.parse_args(argv)
    for flag in ("port", "cb_num_blocks", "cb_max_batch_tokens"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "port" else 1):
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch and transformers are imported: --help and bad arguments answer at once

    def serve() -> None:
        from nanochat_hf.serving.server import ServeOptions, start

        try:
            server = start(ServeOptions(**vars(args)))
        except ImportError as e:  # fastapi / uvicorn / openai missing
            raise UserError(f"{e.msg}: install the serve extra (pip install 'nanochat-hf[serve]')") from e
        try:
            server.run()
        except KeyboardInterrupt:  # Ctrl-C (uvicorn re-raises it once it has shut down): how a server is stopped
            pass

    return run_cli(PROG, serve)
