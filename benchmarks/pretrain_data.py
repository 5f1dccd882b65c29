"""Does pretraining's data stream (`PretrainStream`: parquet through `datasets`, tokenization, HEAD's best-fit
packing) keep up with the step? Its time per micro-batch against the model's forward + backward on the same
micro-batch, on the same CPU threads, in one process.

    python benchmarks/pretrain_data.py                          # d4, T = 2048, B = 1, 1 thread (~1-2 min)
    python benchmarks/pretrain_data.py --depth 12 --threads 2

Work: `--shards` synthetic shards (`write_synthetic_shards`: english words, documents of a few sentences, shorter
than ClimbMix's, so more documents per row: more packing work per token than on real data) in a temporary folder,
a tokenizer trained on them (`--vocab`), the G5 model at `--depth` (`NanoChatGPTConfig.from_depth`, vocab 32768 as
HEAD's tokenizer, window pattern SSSL, fp32). Rows of the table (the median of `--repeats` timings, each over
`--micro_batches` micro-batches after one untimed warm-up, which fills the stream's buffer of 1000 documents):
- read: reading a micro-batch's documents through `datasets` (`document_batches`), alone;
- tokenize (tokenizers): encoding them with a BOS (the Rust backend's `encode_batch_fast`), alone; (tiktoken,
  HEAD's): the same documents with tiktoken's `encode_ordinary_batch` on the same vocabulary (ids checked equal),
  what HEAD's loader calls;
- stream: `PretrainStream.read`: reading, tokenizing and packing, what the Trainer waits for;
- step: the model's forward and backward on one micro-batch (no optimizer step: a longer step only makes the
  stream's share smaller).
"loader / step" is the stream's time per micro-batch over the step's: the fraction of a step the stream adds when it
runs in the training process between micro-batches, as HEAD's and ours do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> dict:
    """Print the table; return {"rows": {name: seconds per micro-batch}, "docs_per_micro_batch", "loader_per_step"}."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1, help="device_batch_size (rows per micro-batch)")
    p.add_argument("--threads", type=int, default=1, help="torch threads and the tokenizer's Rust threads")
    p.add_argument("--vocab", type=int, default=8192, help="the tokenizer's vocabulary (trained on the shards)")
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--docs_per_shard", type=int, default=20000)
    p.add_argument("--micro_batches", type=int, default=200, help="stream micro-batches per timing")
    p.add_argument("--docs", type=int, default=2048, help="documents per timing of reading and tokenizing alone")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # the tokenizer's thread pool, before its first use

    import torch

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.conversion.generations import BY_NAME, layer_windows
    from nanochat_hf.data.pretraining import (
        PretrainStream,
        document_batches,
        list_shards,
        ordinary_encoder,
        split_shards,
        synthetic_documents,
        write_synthetic_shards,
    )
    from nanochat_hf.tokenizer import to_mergeable_ranks, train_tokenizer
    from nanochat_hf.tokenizer.nanochat_format import _split_pattern

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        shards = [str(s) for s in write_synthetic_shards(tmp, a.shards, a.docs_per_shard, seed=0)]
        tokenizer = train_tokenizer(synthetic_documents(min(5000, a.shards * a.docs_per_shard), seed=1), a.vocab)
        print(f"{a.shards} shards of {a.docs_per_shard} documents and the tokenizer: {time.perf_counter() - t0:.1f} s")
        list_shards(tmp)

        stream = PretrainStream(tokenizer, a.batch, a.seq, shards=shards)
        next(stream.read(1))  # warm-up: fills the buffer
        stream_s, arrivals = [], stream._arrivals
        for _ in range(a.repeats):
            t = time.perf_counter()
            for _ in stream.read(a.micro_batches):
                pass
            stream_s.append((time.perf_counter() - t) / a.micro_batches)
        docs_per_mb = (stream._arrivals - arrivals) / (a.repeats * a.micro_batches)  # documents the stream took
        if not docs_per_mb:
            p.error("the stream refilled no documents while timed: raise --micro_batches")

        # reading and tokenizing alone: time per document over --docs documents, times the stream's documents per
        # micro-batch; HEAD's tokenizer (tiktoken's encode_ordinary_batch, same vocabulary) where tiktoken is installed
        batches = document_batches(split_shards(shards, "train"))
        encoder, bos = ordinary_encoder(tokenizer), tokenizer.bos_token_id
        try:
            import tiktoken

            ranks, specials = to_mergeable_ranks(tokenizer)
            pattern = _split_pattern(tokenizer)
            head = tiktoken.Encoding("head", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        except ImportError:
            head = None
        read_s, tok_s, head_s, chars, tokens = [], [], [], 0, 0
        for _ in range(a.repeats):
            t, docs = time.perf_counter(), []
            while len(docs) < a.docs:
                docs += next(batches)[0]
            read_s.append((time.perf_counter() - t) / len(docs) * docs_per_mb)
            t = time.perf_counter()
            ids = [[bos, *e.ids] for e in encoder.encode_batch_fast(docs, add_special_tokens=False)]
            tok_s.append((time.perf_counter() - t) / len(docs) * docs_per_mb)
            if head is not None:
                t = time.perf_counter()
                head_ids = head.encode_ordinary_batch(docs, num_threads=a.threads)
                head_s.append((time.perf_counter() - t) / len(docs) * docs_per_mb)
                assert [x[1:] for x in ids] == head_ids, "the two tokenizers disagree"
            chars, tokens = chars + sum(map(len, docs)), tokens + sum(map(len, ids))

        g5 = BY_NAME["G5"]
        layer_types, window = layer_windows(g5, "SSSL", a.seq, a.depth)  # HEAD's default window pattern
        config = NanoChatGPTConfig.from_depth(
            a.depth, vocab_size=32768, sequence_len=a.seq, layer_types=layer_types, sliding_window=window, **g5.fields
        )
        model = NanoChatGPTForCausalLM(config).train()
        batch = next(stream.read(1))
        step_s = []
        for i in range(a.repeats + 1):
            t = time.perf_counter()
            model(**batch).loss.backward()
            model.zero_grad(set_to_none=True)
            if i:  # the first is a warm-up
                step_s.append(time.perf_counter() - t)

    n = a.batch * a.seq
    rows = [
        ("read (datasets)", statistics.median(read_s)),
        ("tokenize (tokenizers)", statistics.median(tok_s)),
        *([("tokenize (tiktoken, HEAD's)", statistics.median(head_s))] if head_s else []),
        ("stream (read+tokenize+pack)", statistics.median(stream_s)),
        (f"step d{a.depth} fwd+bwd", statistics.median(step_s)),
    ]
    print(
        f"\nB={a.batch} T={a.seq}, {a.threads} thread(s), tokenizer vocab {a.vocab}; {docs_per_mb:.1f} documents per "
        f"micro-batch ({chars / max(tokens, 1):.2f} chars/token)"
    )
    print(f"| {'':28} | ms / micro-batch | micro-batches/s | tokens/s |")
    print(f"|{'-' * 30}|-----------------:|----------------:|---------:|")
    for name, s in rows:
        print(f"| {name:28} | {s * 1e3:16.1f} | {1 / s:15.1f} | {n / s:8.0f} |")
    ratio = statistics.median(stream_s) / statistics.median(step_s)
    print(f"\nloader / step: {ratio:.4f}")
    return {"rows": dict(rows), "docs_per_micro_batch": docs_per_mb, "loader_per_step": ratio}


if __name__ == "__main__":
    main()
