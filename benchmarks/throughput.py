"""Training throughput of MidTrainer vs a plain PyTorch loop (same model, batch, optimizer, precision).

    python benchmarks/throughput.py                      # small CPU model
    python benchmarks/throughput.py --depth 20 --seq 2048 --batch 32 --grad_accum 1   # d20 on one GPU

Both run `--steps` optimizer steps on random tokens; the first `--warmup` steps are not timed. Prints tokens/s of
each and the ratio (target: Trainer >= 0.95 x plain loop). The plain loop does what nanochat's loop does per
step: grad_accum forward/backward passes (loss / grad_accum), loss.item(), Muon momentum + LR update, step, zero_grad.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time

import torch
from transformers import TrainerCallback

import nanochat_hf  # noqa: F401
from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.optim import build_optimizer
from nanochat_hf.training.arguments import parse_args
from nanochat_hf.training.schedule import muon_momentum
from nanochat_hf.training.trainer import MidTrainer


class RandomStream:
    """Endless random micro-batches of (B, T+1) tokens, with the PackedStream methods the trainer uses."""

    def __init__(self, vocab: int, batch: int, seq: int, count: int):
        g = torch.Generator().manual_seed(0)
        self.batches = [torch.randint(0, vocab, (batch, seq + 1), generator=g) for _ in range(4)]
        self.count = count

    def num_micro_batches(self) -> int:
        return self.count

    def state_dict(self) -> dict:
        return {}

    def read(self, count: int | None = None):
        for i in range(self.count if count is None else count):
            x = self.batches[i % len(self.batches)]
            yield {"input_ids": x, "labels": x}


def build_model(a, device) -> NanoChatGPTForCausalLM:
    torch.manual_seed(0)
    n_embd = a.n_embd or 64 * a.depth
    n_head = max(1, -(-n_embd // 128)) if a.n_embd is None else max(1, n_embd // 64)
    cfg = NanoChatGPTConfig(vocab_size=a.vocab, n_layer=a.depth, n_embd=n_embd, n_head=n_head, n_kv_head=n_head,
                            sequence_len=a.seq)
    return NanoChatGPTForCausalLM(cfg).to(device)


def plain_loop(a, device, bf16: bool) -> float:
    model = build_model(a, device)
    opt = build_optimizer(model)
    stream = RandomStream(a.vocab, a.batch, a.seq, a.steps * a.grad_accum).read()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    total = a.steps
    t0 = None
    for step in range(total):
        if step == a.warmup:
            sync()
            t0 = time.perf_counter()
        lrm = 1.0 if step / total < 0.8 else 1 - (step / total - 0.8) / 0.2
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        opt.set_muon_momentum(muon_momentum(step))
        for _ in range(a.grad_accum):
            batch = next(stream)
            x = batch["input_ids"].to(device, non_blocking=True)
            with autocast:
                loss = model(input_ids=x, labels=x).loss
            (loss / a.grad_accum).backward()
        loss.item()
        opt.step()
        model.zero_grad(set_to_none=True)
    sync()
    return (total - a.warmup) * a.grad_accum * a.batch * a.seq / (time.perf_counter() - t0)


class _Timer(TrainerCallback):
    def __init__(self, warmup: int):
        self.warmup, self.t0, self.t1 = warmup, None, None

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if state.global_step == self.warmup:
            self.t0 = time.perf_counter()
        self.t1 = time.perf_counter()


class _BenchTrainer(MidTrainer):
    def make_stream(self, token_ds):
        a = self.bench
        return RandomStream(a.vocab, a.batch, a.seq, a.steps * a.grad_accum)


def trainer_loop(a, device, bf16: bool) -> float:
    model = build_model(a, device)
    out = tempfile.mkdtemp(prefix="bench-")
    args = parse_args([
        "--model_source", "benchmark", "--output_dir", out, "--max_seq_len", str(a.seq),
        "--device_batch_size", str(a.batch), "--total_batch_size", str(a.batch * a.seq * a.grad_accum),
        "--num_iterations", str(a.steps), "--eval_every", "0", "--dtype", "bfloat16" if bf16 else "float32",
        "--report_to", "none", "--disable_tqdm", "true", "--torch_compile", str(a.compile).lower(),
    ])
    _BenchTrainer.bench = a
    timer = _Timer(a.warmup)
    trainer = _BenchTrainer(model=model, args=args, train_dataset=[0], eval_dataset=None,
                            token_bytes=torch.ones(a.vocab, dtype=torch.long), callbacks=[timer])
    with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines
        trainer.train()
    return (a.steps - a.warmup) * a.grad_accum * a.batch * a.seq / (timer.t1 - timer.t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--repeats", type=int, default=2, help="alternate the two loops this many times, keep the best")
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = a.dtype == "bfloat16" or (a.dtype == "auto" and device.type == "cuda")
    plain, ours = 0.0, 0.0
    for _ in range(a.repeats):
        plain = max(plain, plain_loop(a, device, bf16))
        ours = max(ours, trainer_loop(a, device, bf16))
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({os.cpu_count()} cores visible, " \
        f"{torch.get_num_threads()} threads)"
    print(f"device: {name}; model depth {a.depth} width {a.n_embd} vocab {a.vocab}; batch {a.batch}x{a.seq} "
          f"x grad_accum {a.grad_accum}; {'bf16 autocast' if bf16 else 'fp32'}")
    print(f"| loop | tok/s |\n|---|---|\n| plain PyTorch | {plain:,.0f} |\n| MidTrainer | {ours:,.0f} |")
    print(f"ratio MidTrainer / plain: {ours / plain:.3f}")


if __name__ == "__main__":
    main()
