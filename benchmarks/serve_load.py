"""The chat server under load: 8 concurrent openai clients against ``python -m nanochat_hf.serving`` on loopback,
next to our generate() loop on the same prompts, in the same run.

    python benchmarks/serve_load.py                      # demo shape (depth 4, vocab 4096), 8 clients, 60 s
    python benchmarks/serve_load.py --model DIR --clients 8 --seconds 60

The server runs in its own process (1 thread), once one request at a time (generate() on transformers' generation
thread) and once with --continuous-batching (greedy, calculator off). Each client streams replies to the prompts in
turn until --seconds have passed or it has sent --max-requests (bounded; the run stops by itself). Every streamed
reply must be the text our generate() gives for its prompt (nothing lost or mixed between streams); a failed or
different reply is counted and makes the run exit 1. Latency: request sent to last chunk. Throughput: completion
tokens per second of wall time, all clients together; the ratio is against the generate() loop (one prompt after
another, in this process, 1 thread).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

QUESTIONS = [
    "What is the capital of France?",
    "Tell me a story about a dragon.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name three colours.",
    "Why is the sky blue?",
    "Say hello in Spanish.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: a random demo-shaped model)")
    parser.add_argument("--depth", type=int, default=4, help="depth of the random model")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="per server mode, at most")
    parser.add_argument("--max-requests", type=int, default=6, help="per client and server mode, at most")
    parser.add_argument("--max-tokens", type=int, default=32)
    return parser.parse_args(argv)


def random_model_dir(folder: Path, depth: int) -> Path:
    import torch

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.data.demo import DEMO_SEQUENCE_LEN

    tokenizer = demo_tokenizer()
    config = NanoChatGPTConfig.from_depth(depth, vocab_size=len(tokenizer), sequence_len=DEMO_SEQUENCE_LEN)
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random everywhere: a fresh model's zero projections would repeat one token
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else p.shape[-1] ** -0.5))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def generate_loop(folder: Path, max_tokens: int) -> tuple[dict, dict[bool, list[str]]]:
    """Our generate() on each prompt in turn, calculator on and off: the row, and each prompt's expected text."""
    import torch
    from transformers import AutoTokenizer

    from nanochat_hf import NanoChatGPTForCausalLM
    from nanochat_hf.inference import generate_tokens
    from nanochat_hf.serving.server import ReplyText
    from nanochat_hf.tokenizer import render_for_completion

    torch.set_num_threads(1)
    model = NanoChatGPTForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reply_text = ReplyText(tokenizer)
    prompts = [render_for_completion(tokenizer, {"messages": [{"role": "user", "content": q}]}) for q in QUESTIONS]
    expected: dict[bool, list[str]] = {}
    latencies, tokens = [], 0
    start = time.perf_counter()
    for calculator in (True, False):
        expected[calculator] = []
        for prompt in prompts:
            began = time.perf_counter()
            (reply,) = generate_tokens(model, tokenizer, [prompt], max_tokens, calculator=calculator)
            if calculator:
                latencies.append(time.perf_counter() - began)
                tokens += len(reply)
            expected[calculator].append(reply_text(reply))
        if calculator:
            wall = time.perf_counter() - start
    row = {"requests": len(prompts), "failed": 0, "different": 0, "tokens": tokens, "wall": wall}
    return {**row, "latencies": latencies}, expected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_load(folder: Path, batching: bool, args: argparse.Namespace, expected: list[str]) -> dict:
    """Start the server, run the clients against it, stop it; the row."""
    from openai import OpenAI

    port = free_port()
    command = [sys.executable, "-m", "nanochat_hf.serving", str(folder), "--port", str(port), "--name", "bench"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command + (["--continuous-batching"] if batching else []), env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not answer within 300 s") from None
                time.sleep(0.5)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        lock = threading.Lock()
        row = {"requests": 0, "failed": 0, "different": 0, "tokens": 0, "latencies": []}
        stop_at = time.monotonic() + args.seconds

        def run_client(index: int) -> None:
            for n in range(args.max_requests):
                if time.monotonic() > stop_at:
                    return
                i = (index + n) % len(QUESTIONS)
                began = time.perf_counter()
                try:
                    stream = client.chat.completions.create(
                        model="bench",
                        messages=[{"role": "user", "content": QUESTIONS[i]}],
                        max_tokens=args.max_tokens,
                        stream=True,
                    )
                    chunks = list(stream)
                    text = "".join(c.choices[0].delta.content or "" for c in chunks)
                    used = chunks[-1].usage.completion_tokens
                    failed = False
                except Exception as e:  # counted and shown: the benchmark exists to find these
                    print(f"client {index}: {type(e).__name__}: {e}", file=sys.stderr)
                    failed, text, used = True, None, 0
                with lock:
                    row["requests"] += 1
                    row["failed"] += failed
                    row["different"] += not failed and text != expected[i]
                    row["tokens"] += used
                    row["latencies"].append(time.perf_counter() - began)

        start = time.perf_counter()
        threads = [threading.Thread(target=run_client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        row["wall"] = time.perf_counter() - start
        return row
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if args.model else random_model_dir(Path(tmp), args.depth)
        baseline, expected = generate_loop(folder, args.max_tokens)
        rows = {"generate() loop, 1 client": baseline}
        rows[f"server, {args.clients} clients"] = serve_and_load(folder, False, args, expected[True])
        rows[f"server --continuous-batching, {args.clients} clients"] = serve_and_load(
            folder, True, args, expected[False]
        )
    base_rate = baseline["tokens"] / baseline["wall"]
    print(f"\nmachine: {platform.machine()} {_cpu_name()}, {os.cpu_count()} cores; 1 thread per process")
    print(f"load: {_uptime()}")
    print(f"model: {args.model or f'random, depth {args.depth}, demo tokenizer'}; max_tokens {args.max_tokens}")
    print("\n| run | requests | failed | different | tokens/s | x generate() | p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        rate = r["tokens"] / r["wall"]
        p50, p99 = percentile(r["latencies"], 50), percentile(r["latencies"], 99)
        print(
            f"| {name} | {r['requests']} | {r['failed']} | {r['different']} | {rate:.1f} | {rate / base_rate:.2f} "
            f"| {p50:.2f} | {p99:.2f} |"
        )
    return 1 if any(r["failed"] or r["different"] for r in rows.values()) else 0


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
