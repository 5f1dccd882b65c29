"""Tokens/s of greedy `generate` with the KV cache: our NanoChatGPTForCausalLM vs transformers' NanoChatForCausalLM.

    python benchmarks/generation.py                    # demo shape (depth 4, width 256, vocab 4096) on CPU
    python benchmarks/generation.py --depth 12 --device cuda

Both models hold the same random weights: ours is saved, exported with `to_native` (the project's conversion,
into a temporary folder) and the native model loads that export. Ours uses `rotary_dtype="float32"`, the tables the
native model computes, so both should pick the same tokens. Batch 1 gets one prompt; batch 8 gets prompts of
different lengths, left-padded, with an attention mask. Every call generates exactly `--new_tokens` tokens
(min_new_tokens = max_new_tokens, so an eos cannot stop it early). The two models alternate within each repeat (a
change in load on shared cores hits both alike), after one untimed warm-up each; the table shows the best repeat.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from transformers import GenerationConfig, NanoChatForCausalLM

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.conversion.native import to_native
from nanochat_hf.data.demo import DEMO_VOCAB_SIZE

BOS, PAD = 0, 1  # token ids given to the configs; prompts are random ids from 2 up


def random_model(depth: int, vocab: int, seq: int, dtype: torch.dtype) -> NanoChatGPTForCausalLM:
    """A depth-`depth` model with random weights everywhere (a fresh model's lm_head and output projections are
    zero, which would make every logit equal and every greedy token the same)."""
    config = NanoChatGPTConfig.from_depth(
        depth,
        vocab_size=vocab,
        sequence_len=seq,
        rotary_dtype="float32",
        bos_token_id=BOS,
        eos_token_id=BOS,
        pad_token_id=PAD,
    )
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 1.0 if "wte" in name else p.shape[1] ** -0.5  # logits of order 1: many distinct argmaxes
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.to(dtype).eval()


def prompts(batch: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    """`batch` random prompts, the longest `length` tokens, the others shorter, left-padded; each starts with bos."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(2, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        n = length - (row * length) // (2 * batch)  # from `length` down to about half of it
        ids[row, : length - n], mask[row, : length - n] = PAD, 0
        ids[row, length - n] = BOS
    return {"input_ids": ids, "attention_mask": mask}


def timed_generate(
    model, inputs: dict[str, torch.Tensor], config: GenerationConfig, device: torch.device
) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(**inputs, generation_config=config)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def first_difference(a: torch.Tensor, b: torch.Tensor, prompt_len: int) -> str:
    if a.shape != b.shape:
        return f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    row, col = (a != b).nonzero()[0].tolist()
    return f"first difference: row {row}, new token {col - prompt_len}"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=4, help="nanochat depth dial: layers, width 64*depth")
    parser.add_argument("--vocab", type=int, default=DEMO_VOCAB_SIZE, help="vocabulary (default: the demo's)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt_len", type=int, default=32, help="longest prompt; batch > 1 has shorter ones")
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (default 1: a decode step of the demo model is too small to split, and on "
        "shared cores a second thread mostly spin-waits, making runs 10x slower and erratic)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="weights and activations (default: bfloat16 on CUDA, float32 on CPU)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))

    ours = random_model(args.depth, args.vocab, args.prompt_len + args.new_tokens, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(os.path.join(tmp, "ours"))
        to_native(os.path.join(tmp, "ours"), os.path.join(tmp, "native"))
        native = NanoChatForCausalLM.from_pretrained(os.path.join(tmp, "native"), dtype=dtype)
    models = {"ours": ours.to(device), "native": native.to(device).eval()}
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        bos_token_id=BOS,
        eos_token_id=BOS,
        pad_token_id=PAD,
    )

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(
        f"device: {name}; torch {torch.__version__}; d{args.depth} (width {ours.config.n_embd}, vocab "
        f"{args.vocab}), {args.dtype or dtype}; greedy, KV cache; best of {args.repeats} interleaved repeats"
    )
    if hasattr(os, "getloadavg"):
        print(f"load average before: {os.getloadavg()[0]:.2f} (other processes share these cores if > ~0)")
    header = f"{'batch':>5} {'new tokens':>10} {'ours tok/s':>11} {'native tok/s':>12} {'ours/native':>11}  same tokens"
    print(header)
    print("-" * len(header))
    rows = []
    for batch in args.batch:
        inputs = {k: v.to(device) for k, v in prompts(batch, args.prompt_len, args.vocab).items()}
        outputs = {k: timed_generate(m, inputs, gen, device)[1] for k, m in models.items()}  # warm-up, tokens
        times: dict[str, list[float]] = {k: [] for k in models}
        for r in range(args.repeats):
            # alternate who goes first, so neither always runs right after the other's allocations
            for k in list(models) if r % 2 == 0 else list(models)[::-1]:
                times[k].append(timed_generate(models[k], inputs, gen, device)[0])
        new = outputs["ours"].shape[1] - args.prompt_len
        rate = {k: batch * new / min(t) for k, t in times.items()}
        same = torch.equal(outputs["ours"], outputs["native"])
        note = "yes" if same else "NO, " + first_difference(outputs["ours"], outputs["native"], args.prompt_len)
        print(
            f"{batch:>5} {new:>10} {rate['ours']:>11,.0f} {rate['native']:>12,.0f} "
            f"{rate['ours'] / rate['native']:>11.2f}  {note}"
        )
        rows.append(
            {"batch": batch, "new_tokens": new, "ours": rate["ours"], "native": rate["native"], "same_tokens": same}
        )
    if hasattr(os, "getloadavg"):
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
