"""Training tokens/s (forward + backward) of nanochat's model generations at the same size: G5 (March 2026) against
the December model G0.

    python benchmarks/generations.py                         # depth 4, seq 512, vocab 8192 on CPU, 1 thread
    python benchmarks/generations.py --depth 12 --seq 2048 --vocab 65536 --batch 8 --device cuda   # bf16 autocast

G5 here is nanochat's HEAD model: residual and x0 lambdas, value embeddings on every other layer with their gates,
q/k scaled by 1.2, RoPE base 1e5, smear, backout, window pattern "SSSL" (short window ceil(seq/4/128)*128, the last
layer full), vocab padded to 64. Both models get random weights (seed 0: matrices N(0, 1/fan_in), embeddings
N(0, 1), the scalars at their init), as a model looks after a few steps. From their from-scratch inits instead
(G0's lm_head and output projections all zero, G5's nearly so) one loaded CPU run gave G5 1.28x (sdpa) and 2.4x
(eager) G0's tok/s, far from the random-weight ratios: the fresh models are not the workload training runs. Both
train on the same random tokens (loss = our causal LM loss on labels = inputs); a step
is one forward + backward (no optimizer).
The two models alternate within each repeat (a change in load on shared cores hits both alike), after one untimed
warm-up each; the table shows the best repeat and the ratio G5 / G0.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM


def g5_fields(n_layer: int, seq: int) -> dict:
    """The NanoChatGPTConfig fields of nanochat's G5 model (a825e63 = HEAD) with its default window pattern."""
    short = -(-seq // 4 // 128) * 128
    layer_types = ["sliding_attention" if "SSSL"[i % 4] == "S" else "full_attention" for i in range(n_layer)]
    layer_types[-1] = "full_attention"
    return {
        "residual_lambdas": True,
        "value_embeddings": True,
        "ve_gate_channels": 12,
        "ve_gate_scale": 3.0,
        "qk_scale": 1.2,
        "rope_theta": 100000.0,
        "smear": True,
        "backout": True,
        "pad_vocab_size_to": 64,
        "layer_types": layer_types,
        "sliding_window": short + 1,
    }


def build(
    generation: str, depth: int, vocab: int, seq: int, device: torch.device, attn: str = "sdpa"
) -> NanoChatGPTForCausalLM:
    torch.manual_seed(0)
    fields = g5_fields(depth, seq) if generation == "G5" else {}
    config = NanoChatGPTConfig.from_depth(depth, vocab_size=vocab, sequence_len=seq, **fields)
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                w = module.weight
                w.copy_(
                    torch.randn(w.shape, generator=g)
                    * (1.0 if isinstance(module, nn.Embedding) else w.shape[1] ** -0.5)
                )
    model.set_attn_implementation(attn)
    return model.to(device).train()


def timed_step(model: NanoChatGPTForCausalLM, ids: torch.Tensor, device: torch.device) -> float:
    """Seconds of one forward + backward (bf16 autocast on CUDA, as nanochat trains there)."""
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--attn", default="sdpa", help="attn_implementation of both models (sdpa, eager, ...)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    models = {g: build(g, args.depth, args.vocab, args.seq, device, args.attn) for g in ("G0", "G5")}
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    c = models["G5"].config
    print(
        f"device: {name}; torch {torch.__version__}; d{args.depth} (width {c.n_embd}, {c.n_layer} layers), vocab "
        f"{args.vocab}, batch {args.batch} x seq {args.seq}, attention {c._attn_implementation}; forward + backward; "
        f"best of {args.repeats} interleaved repeats"
    )
    print(
        f"G5 layers: {''.join('S' if t == 'sliding_attention' else 'L' for t in c.layer_types)}, short window "
        f"{c.sliding_window - 1} (+ the token itself)"
    )
    if hasattr(os, "getloadavg"):
        print(f"load average before: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    for model in models.values():  # warm-up
        timed_step(model, ids, device)
    times: dict[str, list[float]] = {g: [] for g in models}
    for r in range(args.repeats):
        for g in list(models) if r % 2 == 0 else list(models)[::-1]:
            times[g].append(timed_step(models[g], ids, device))
    rate = {g: ids.numel() / min(t) for g, t in times.items()}
    params = {g: sum(p.numel() for p in m.parameters()) for g, m in models.items()}
    header = f"{'generation':<10} {'params':>12} {'tok/s':>10} {'/ G0':>6}"
    print(header)
    print("-" * len(header))
    rows = []
    for g in models:
        print(f"{g:<10} {params[g]:>12,} {rate[g]:>10,.0f} {rate[g] / rate['G0']:>6.2f}")
        rows.append({"generation": g, "params": params[g], "tok_s": rate[g], "ratio": rate[g] / rate["G0"]})
    if hasattr(os, "getloadavg"):
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
