"""Tokens/s of greedy decoding with the KV cache: the `to-onnx` export in onnxruntime (float32 and int8) against the
torch model's `generate()`, on the same CPU.

    python benchmarks/onnx_speed.py                    # demo shape (depth 4, width 256, vocab 4096), 1 thread
    python benchmarks/onnx_speed.py --depth 12 --threads 4
    python benchmarks/onnx_speed.py --generation G5      # nanochat HEAD's model (windows, smear, ...)

The model has random weights (G0: benchmarks/generation.py's `random_model`; G5: benchmarks/generations.py's
`build`), is saved and exported with `to_onnx` into a temporary folder. Batch 1, one prompt of `--prompt_len`
tokens, exactly `--new_tokens` new ones (the prompt's forward included, in all three). onnxruntime decodes as
transformers.js does (`OnnxDecoder`). The three alternate within each repeat (a change in load on shared cores hits
all alike), after one untimed warm-up each; the table shows the best repeat, and whether each picked the torch
model's tokens (int8: how many of them).
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from pathlib import Path

import torch
from generation import BOS, PAD, random_model
from generations import build
from startup import cpu_name
from transformers import GenerationConfig

from nanochat_hf.conversion.onnx import FLOAT32, INT8, OnnxDecoder, to_onnx
from nanochat_hf.data.demo import DEMO_VOCAB_SIZE


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generation", choices=["G0", "G5"], default="G0")
    parser.add_argument("--depth", type=int, default=4, help="nanochat depth dial: layers, width 64*depth")
    parser.add_argument("--vocab", type=int, default=DEMO_VOCAB_SIZE, help="vocabulary (default: the demo's)")
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of torch and of onnxruntime")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    seq = args.prompt_len + args.new_tokens
    if args.generation == "G0":
        model = random_model(args.depth, args.vocab, seq, torch.float32)
    else:
        model = build("G5", args.depth, args.vocab, seq, torch.device("cpu")).eval()
    g = torch.Generator().manual_seed(1)
    prompt = [BOS] + torch.randint(2, args.vocab, (args.prompt_len - 1,), generator=g).tolist()
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        bos_token_id=BOS,
        eos_token_id=BOS,
        pad_token_id=PAD,
    )
    ids = torch.tensor([prompt])
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "model")
        out = to_onnx(Path(tmp) / "model", Path(tmp) / "onnx")
        sizes = {"float32": (out / FLOAT32).stat().st_size, "int8": (out / INT8).stat().st_size}
        runs = {
            "torch generate()": lambda: model.generate(ids, generation_config=gen)[0, len(prompt) :].tolist(),
            "onnxruntime float32": lambda d=OnnxDecoder(out / FLOAT32, args.threads): d.greedy(
                [prompt], args.new_tokens
            )[0],
            "onnxruntime int8": lambda d=OnnxDecoder(out / INT8, args.threads): d.greedy([prompt], args.new_tokens)[0],
        }
        with torch.no_grad():
            tokens = {name: run() for name, run in runs.items()}  # warm-up, and the tokens each picks
            times: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.repeats):
                for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                    t0 = time.perf_counter()
                    runs[name]()
                    times[name].append(time.perf_counter() - t0)

    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {cpu_name()}, {args.threads} thread(s); torch "
        f"{torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}; {args.generation} d{args.depth} "
        f"(width {model.config.n_embd}, vocab {args.vocab}, float32 {sizes['float32'] / 2**20:.0f} MiB, int8 "
        f"{sizes['int8'] / 2**20:.0f} MiB); batch 1, prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy "
        f"with the KV cache; best of {args.repeats} interleaved repeats"
    )
    if hasattr(os, "getloadavg"):
        print(f"load average: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    header = f"{'':<20} {'tok/s':>7} {'x torch':>8}  torch's tokens"
    print(header)
    print("-" * len(header))
    base = args.new_tokens / min(times["torch generate()"])
    rows = []
    for name, t in times.items():
        rate = args.new_tokens / min(t)
        same = sum(a == b for a, b in zip(tokens[name], tokens["torch generate()"]))
        print(f"{name:<20} {rate:>7,.0f} {rate / base:>8.2f}  {same}/{args.new_tokens}")
        rows.append({"name": name, "tokens_per_s": rate, "ratio": rate / base, "same_tokens": same})
    return rows


if __name__ == "__main__":
    main()
