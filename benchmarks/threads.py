"""Tokens/s with 1 vs 2 (or --threads) torch CPU threads: greedy generation and training steps of the demo model.

    python benchmarks/threads.py                 # demo shape: depth 4 (width 256), vocab 4096, fp32, CPU
    python benchmarks/threads.py --threads 1,2,4 --repeats 5

What `cpu_threads` (nanochat_hf.training.device: mid_train's and chat_eval.py's default thread count) is chosen
from. Generation: greedy `generate` with the KV cache, batch 1 and 8, `--new_tokens` new tokens each (eos cannot
stop it early). Training: forward + backward + the Muon/AdamW step on 8 x 256 tokens, as the demo's micro-batch.
The thread counts alternate within each repeat (a change in load on shared cores hits all alike), after one
untimed warm-up each; the table shows the median repeat and the ratio to the first thread count. The 1-minute load
average is printed before and after: on cores that other jobs use, extra threads spin-wait instead of working.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import GenerationConfig

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data.demo import DEMO_VOCAB_SIZE
from nanochat_hf.optim import build_optimizer


def demo_model(depth: int, vocab: int, seed: int = 0) -> NanoChatGPTForCausalLM:
    """The demo's model shape with random weights everywhere (a fresh model's zero projections would make every
    greedy token the same)."""
    config = NanoChatGPTConfig.from_depth(
        depth, vocab_size=vocab, sequence_len=512, bos_token_id=0, eos_token_id=0, pad_token_id=1
    )
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else p.shape[1] ** -0.5))
    return model


def generation_tok_s(model, batch: int, new_tokens: int, vocab: int) -> float:
    ids = torch.randint(2, vocab, (batch, 24), generator=torch.Generator().manual_seed(batch))
    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=1, eos_token_id=0
    )
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return batch * new_tokens / (time.perf_counter() - t0)


def training_tok_s(model, optimizer, rows: int, seq: int, vocab: int) -> float:
    ids = torch.randint(2, vocab, (rows, seq + 1), generator=torch.Generator().manual_seed(rows))
    t0 = time.perf_counter()
    loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return rows * seq / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts; the first is the baseline")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--vocab", type=int, default=DEMO_VOCAB_SIZE)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--rows", type=int, default=8, help="training rows of --seq tokens per step")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    load_before = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    infer = demo_model(args.depth, args.vocab).eval()
    train = demo_model(args.depth, args.vocab).train()
    optimizer = build_optimizer(
        train, matrix_lr=0.02, embedding_lr=0.2, unembedding_lr=0.004, weight_decay=0.0, init_lr_frac=1.0
    )
    arms = {
        "generate, batch 1": lambda: generation_tok_s(infer, 1, args.new_tokens, args.vocab),
        "generate, batch 8": lambda: generation_tok_s(infer, 8, args.new_tokens, args.vocab),
        f"train step, {args.rows} x {args.seq}": lambda: training_tok_s(
            train, optimizer, args.rows, args.seq, args.vocab
        ),
    }
    results = {(arm, n): [] for arm in arms for n in counts}
    for repeat in range(args.repeats + 1):  # repeat 0 is the untimed warm-up
        for arm, run in arms.items():
            for n in counts:
                torch.set_num_threads(n)
                value = run()
                if repeat:
                    results[arm, n].append(value)
    load_after = os.getloadavg()[0]
    print(
        f"{cores} cores available; 1-minute load average {load_before:.1f} before, {load_after:.1f} after "
        f"(this benchmark adds up to {max(counts)}); median of {args.repeats} repeats\n"
    )
    print(f"| work | threads | tok/s | / {counts[0]} thread{'s' if counts[0] > 1 else ''} |")
    print("|---|---|---|---|")
    rows = []
    for arm in arms:
        base = statistics.median(results[arm, counts[0]])
        for n in counts:
            value = statistics.median(results[arm, n])
            rows.append({"work": arm, "threads": n, "tok_s": value, "ratio": value / base})
            print(f"| {arm} | {n} | {value:,.0f} | {value / base:.2f} |")
    return rows


if __name__ == "__main__":
    main()
