"""The chat server under load and under abuse, against ``python -m nanochat_hf.serving`` on loopback, next to our
generate() loop on the same requests, in the same run.

    python benchmarks/serve_load.py                       # G0 and G5, demo shape (depth 4, vocab 4096, context 1024)
    python benchmarks/serve_load.py --clients 8 32 --max-tokens 32 --abuse-seconds 20

Throughput (for G0 and for G5): the server as it starts by default (1 thread; its model in a process of its own, 1
thread) and N concurrent openai clients, each streaming replies to the prompts in turn (--requests each), half greedy
and half sampled with a seed; every reply must be the text our generate() gives that request alone (a different or
failed reply is counted and makes the run exit 1). Tokens/s is completion tokens per second of wall time, all clients
together; the ratio is against the generate() loop (the same requests one after another, in this process, 1 thread). The
loop and the server's rows take turns, --repeats rounds of each (this machine's speed drifts by 20% over minutes: a
baseline measured only at the start could fall in a fast or a slow minute), and each row is the best of its runs (other
work on the machine only ever slows a run down); failures count over all of them. "x, same round": each run of a row
against the loop of its own round, their median and range (the noise the best-of columns hide).

Abuse (G0): one client sends short requests (max_tokens 8) one after another and its latency (request to whole
reply) is measured, on the idle server, then while an attacker (a process of its own) does the worst it can, then
idle again: the longest generation the context allows (streamed and not, over and over), 50 MB bodies, slowloris
connections, and clients that send a long request and hang up at once (100). Bounded: every phase stops after
--abuse-seconds, loopback only. Idle and attack phases alternate (idle, attack, idle, attack, idle: the machine's
own load drifts); the ratio is against the p95 of all idle phases together.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from generations import g5_fields

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
SAMPLING = [{}, {"temperature": 0.8, "seed": 1}]  # request i: SAMPLING[i % 2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=4, help="depth of the random models")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--requests",
        type=int,
        default=8,
        help="per client (8: 2 s or more of load a row; 3 gave under 1 s, and +-15%%)",
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--abuse-seconds", type=float, default=20.0, help="per abuse phase, at most")
    parser.add_argument("--disconnects", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="rounds: each throughput row is the best of its runs")
    parser.add_argument("--attack", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the attacker's process
    return parser.parse_args(argv)


def random_model_dir(folder: Path, depth: int, generation: str) -> Path:
    import torch

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.data.demo import DEMO_SEQUENCE_LEN

    tokenizer = demo_tokenizer()
    fields = g5_fields(depth, DEMO_SEQUENCE_LEN) if generation == "G5" else {}
    config = NanoChatGPTConfig.from_depth(depth, vocab_size=len(tokenizer), sequence_len=DEMO_SEQUENCE_LEN, **fields)
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


def generate_loop(folder: Path, max_tokens: int) -> tuple[dict, dict[tuple[int, int], str]]:
    """Our generate() on each (prompt, sampling) in turn: the row, and each request's expected text."""
    import torch
    from transformers import AutoTokenizer

    from nanochat_hf import NanoChatGPTForCausalLM
    from nanochat_hf.inference import generate_tokens
    from nanochat_hf.serving.server import ReplyText
    from nanochat_hf.tokenizer import render_for_completion

    torch.set_num_threads(1)
    model = NanoChatGPTForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected, tokens = {}, 0
    start = time.perf_counter()
    for i, question in enumerate(QUESTIONS):
        for s, sampling in enumerate(SAMPLING):
            prompt = render_for_completion(tokenizer, {"messages": [{"role": "user", "content": question}]})
            (reply,) = generate_tokens(model, tokenizer, [prompt], max_tokens, **sampling)
            tokens += len(reply)
            text = ReplyText(tokenizer)
            text.add(reply)
            expected[i, s] = text.text()
    wall = time.perf_counter() - start
    return {"requests": len(expected), "failed": 0, "different": 0, "tokens": tokens, "wall": wall}, expected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """The server in a process of its own (1 thread; its model in one more), stopped with Ctrl-C (SIGINT) at the end."""

    def __init__(self, folder: Path):
        self.port = free_port()
        command = [
            sys.executable,
            "-m",
            "nanochat_hf.serving",
            str(folder),
            "--port",
            str(self.port),
            "--num-threads",
            "1",
        ]
        self.process = subprocess.Popen(command + ["--name", "bench"], env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not answer within 300 s") from None
                time.sleep(0.5)

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0, timeout=300)

    def stop(self) -> float:
        """Seconds from Ctrl-C to exit."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return time.monotonic() - began


def load(served: Served, clients: int, args: argparse.Namespace, expected: dict) -> dict:
    """`clients` concurrent clients, --requests each; the row."""
    client = served.client()
    lock = threading.Lock()
    row = {"requests": 0, "failed": 0, "different": 0, "tokens": 0}

    def run_client(index: int) -> None:
        for n in range(args.requests):
            i, s = (index + n) % len(QUESTIONS), (index + n) % len(SAMPLING)
            try:
                stream = client.chat.completions.create(
                    model="bench",
                    messages=[{"role": "user", "content": QUESTIONS[i]}],
                    max_tokens=args.max_tokens,
                    stream=True,
                    **SAMPLING[s],
                )
                chunks = list(stream)
                text = "".join(c.choices[0].delta.content or "" for c in chunks)
                used, failed = chunks[-1].usage.completion_tokens, False
            except Exception as e:  # counted and shown: the benchmark exists to find these
                print(f"client {index}: {type(e).__name__}: {e}", file=sys.stderr)
                failed, text, used = True, None, 0
            with lock:
                row["requests"] += 1
                row["failed"] += failed
                row["different"] += not failed and text != expected[i, s]
                row["tokens"] += used

    start = time.perf_counter()
    threads = [threading.Thread(target=run_client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    row["wall"] = time.perf_counter() - start
    return row


def victim(served: Served, seconds: float) -> list[float]:
    """Latencies of short requests sent one after another for `seconds`."""
    client, latencies = served.client(), []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        latencies.append(time.perf_counter() - began)
    return latencies


def raw(port: int, data: bytes) -> None:
    """Send the bytes and hang up."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
    except OSError:  # the server refused and closed: what it should do
        pass


def attack(port: int, args: argparse.Namespace) -> dict:
    """The worst one client can do, for --abuse-seconds, in two threads: the longest generations the context allows (no
    max_tokens: the rest of the context; streamed and not) one after another; and, a round every 0.2 s, a 50 MB
    body, a slowloris connection more (20 at most, each sending a header byte a round) and 10 clients that send a
    long request and hang up at once (--disconnects in all)."""
    from openai import OpenAI

    stop = threading.Event()
    counts = dict.fromkeys(["longest generations", "failed", "max_tokens 10**9 refused", "50 MB bodies"], 0)
    counts |= {"slowloris": 0, "hang-ups": 0}
    huge = [{"role": "user", "content": "Tell me everything you know. " * 20}]
    fifty = b"x" * 50_000_000
    chat = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    long_body = json.dumps({"messages": huge}).encode()

    def generations() -> None:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        while not stop.is_set():
            for stream in (False, True):
                try:
                    reply = client.chat.completions.create(model="bench", messages=huge, stream=stream)
                    if stream:
                        list(reply)
                    counts["longest generations"] += 1
                except Exception:
                    counts["failed"] += 1
                try:
                    client.chat.completions.create(model="bench", messages=huge, max_tokens=10**9)
                except Exception:
                    counts["max_tokens 10**9 refused"] += 1

    def the_rest() -> None:
        slow = []
        while not stop.is_set():
            raw(port, f"{chat}Content-Length: 50000000\r\n\r\n".encode() + fifty)
            counts["50 MB bodies"] += 1
            if len(slow) < 20:
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(chat.encode())
                slow.append(s)
            for s in slow:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
            counts["slowloris"] = len(slow)
            for _ in range(min(10, args.disconnects - counts["hang-ups"])):
                raw(port, f"{chat}Content-Length: {len(long_body)}\r\n\r\n".encode() + long_body)
                counts["hang-ups"] += 1
            stop.wait(0.2)
        for s in slow:
            s.close()

    threads = [threading.Thread(target=generations), threading.Thread(target=the_rest)]
    for t in threads:
        t.start()
    stop.wait(args.abuse_seconds)
    stop.set()
    for t in threads:
        t.join()
    return counts


def abuse(served: Served, args: argparse.Namespace) -> list[tuple[str, list[float], dict]]:
    """The victim's latencies idle, under attack (the attacker in a process of its own), idle again."""
    phases = []
    for name in ("idle", "under attack", "idle again", "under attack again", "idle at the end"):
        attacker, counts = None, {}
        if name.startswith("under attack"):
            command = [
                sys.executable,
                __file__,
                "--attack",
                str(served.port),
                "--abuse-seconds",
                str(args.abuse_seconds),
            ]
            attacker = subprocess.Popen([*command, "--disconnects", str(args.disconnects)], stdout=subprocess.PIPE)
            time.sleep(1)  # the attack under way
        latencies = victim(served, args.abuse_seconds - (1 if attacker else 0))
        if attacker:
            counts = json.loads(attacker.communicate(timeout=600)[0])
        phases.append((name, latencies, counts))
    return phases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.attack:
        print(json.dumps(attack(args.attack, args)))
        return 0
    rows, bad = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        for generation in ("G0", "G5"):
            folder = random_model_dir(Path(tmp) / generation, args.depth, generation)
            loops = []
            served = Served(folder)
            try:
                runs = {clients: [] for clients in args.clients}
                for _ in range(args.repeats):  # a round: the loop, then each row (the machine's speed drifts)
                    loop, expected = generate_loop(folder, args.max_tokens)
                    loops.append(loop)
                    if len(loops) == 1:  # warm-up, not shown
                        load(served, 2, argparse.Namespace(**{**vars(args), "requests": 1}), expected)
                    for clients in args.clients:
                        runs[clients].append(load(served, clients, args, expected))
                baseline = max(loops, key=_rate)
                rows[f"{generation}: generate() loop, one request at a time"] = baseline
                for clients, done in runs.items():
                    best = max(done, key=_rate)
                    best |= {k: sum(r[k] for r in done) for k in ("requests", "failed", "different")}
                    paired = [_rate(run) / _rate(loop) for run, loop in zip(done, loops)]
                    rows[f"{generation}: server, {clients} clients"] = {**best, "base": baseline, "paired": paired}
                if generation == "G0":
                    phases = abuse(served, args)
            finally:
                stop_seconds = served.stop()
    print(f"\nmachine: {platform.machine()} {_cpu_name()}, {os.cpu_count()} cores; 1 thread per process")
    print(f"load: {_uptime()}")
    print(f"models: random, depth {args.depth}, demo tokenizer, context 1024; max_tokens {args.max_tokens}")
    print("\n| run | requests | failed | different | tokens/s | x generate() | x, same round: median | min-max |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        base = r.get("base", r)
        rate = _rate(r)
        ratio = rate / _rate(base)
        paired = r.get("paired")  # the loop's own row has none: 1 by definition
        same_round = f"{statistics.median(paired):.2f} | {min(paired):.2f}-{max(paired):.2f}" if paired else "1.00 | -"
        print(
            f"| {name} | {r['requests']} | {r['failed']} | {r['different']} | {rate:.1f} | {ratio:.2f} | {same_round} |"
        )
        bad += r["failed"] + r["different"]
    print("\n| G0, a short request (max_tokens 8) | requests | p50 s | p95 s | p95 / idle p95 |")
    print("|---|---|---|---|---|")
    pooled = {}
    for name, latencies, _ in phases:
        pooled.setdefault("idle" if name.startswith("idle") else "under attack", []).extend(latencies)
    idle_p95 = percentile(pooled["idle"], 95)
    for name, latencies in [(name, latencies) for name, latencies, _ in phases] + [
        (f"all {k} phases", v) for k, v in pooled.items()
    ]:
        p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
        print(f"| {name} | {len(latencies)} | {p50:.3f} | {p95:.3f} | {p95 / idle_p95:.2f} |")
    for name, _, counts in phases:
        if counts:
            print(f"{name}: {', '.join(f'{k}: {v}' for k, v in counts.items())}")
    print(f"Ctrl-C to exit: {stop_seconds:.1f} s")
    return 1 if bad else 0


def _rate(row: dict) -> float:
    return row["tokens"] / row["wall"]


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
