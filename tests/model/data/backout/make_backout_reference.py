"""Writes backout_reference.json (this folder) by executing nanochat HEAD (92d63d4); run by hand, torch 2.13 CPU:

    git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc
    export NANOCHAT_DTYPE=float32 TORCHDYNAMO_DISABLE=1 PYTHONPATH=/tmp/nc
    python tests/model/data/backout/make_backout_reference.py

For a tiny G5 model at depth 2 and at depth 4 (weights: nanochat's state-dict order, ``randn`` from
``torch.Generator().manual_seed(1)``, x0.5 for matrices and x0.1 (+1 for resid_lambdas) otherwise, backout_lambda
-1.75; then a (2, 65) batch from the same generator): nanochat's loss and d loss / d backout_lambda, float32. Then
nanochat's own SFT-like run (its MuonAdamW, chat_sft's init_lr_frac 0.8 and warm-down, 21 steps, fresh batches
from the generator) twice, differing only in float order (one batch of 2 rows, or 2 accumulated micro-batches of
1): backout_lambda at the end of each, and the largest relative difference of every other tensor.
"""

import json
import os
import sys
from pathlib import Path

import torch
from nanochat.gpt import GPT, GPTConfig

assert os.environ.get("NANOCHAT_DTYPE") == "float32" and os.environ.get("TORCHDYNAMO_DISABLE") == "1"
torch.set_num_threads(1)
CONFIG = {"sequence_len": 64, "vocab_size": 60, "n_head": 2, "n_kv_head": 1, "n_embd": 32}
STEPS = 21


def model_and_generator(depth: int) -> tuple[GPT, torch.Generator]:
    model = GPT(GPTConfig(**CONFIG, n_layer=depth, window_pattern="SSSL"))
    model.init_weights()  # the rotary tables (every parameter is set below)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            scale, offset = (0.5, 0.0) if p.ndim == 2 else (0.1, 1.0 if name == "resid_lambdas" else 0.0)
            p.copy_(torch.randn(p.shape, generator=g) * scale + offset)
        model.backout_lambda.fill_(-1.75)
    return model, g


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, CONFIG["vocab_size"], (2, CONFIG["sequence_len"] + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def gradient(depth: int) -> dict:
    model, g = model_and_generator(depth)
    x, y = batch(g)
    loss = model(x, y)
    loss.backward()
    return {"loss": loss.item(), "backout_grad": model.backout_lambda.grad.item()}


def sft_run(depth: int, accumulate: bool) -> dict[str, torch.Tensor]:
    model, g = model_and_generator(depth)
    opt = model.setup_optimizer(unembedding_lr=0.004, embedding_lr=0.3, matrix_lr=0.02, weight_decay=0.0)
    for group in opt.param_groups:  # chat_sft.py: init_lr_frac 0.8
        group["initial_lr"] = group["lr"] = group["lr"] * 0.8
    for step in range(STEPS):
        lrm = 1.0 if step < STEPS // 2 else (STEPS - step) / (STEPS - STEPS // 2)  # warm-down over the second half
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group["kind"] == "muon":
                group["momentum"] = 0.85 + 0.1 * step / 300
        x, y = batch(g)
        if accumulate:
            for r in range(2):
                (model(x[r : r + 1].contiguous(), y[r : r + 1].contiguous()) / 2).backward()
        else:
            model(x, y).backward()
        opt.step()
        model.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def spread(depth: int) -> dict:
    a, b = sft_run(depth, False), sft_run(depth, True)
    others = {n: ((a[n] - b[n]).norm() / a[n].norm()).item() for n in a if n != "backout_lambda"}
    return {
        "backout_lambda": [a["backout_lambda"].item(), b["backout_lambda"].item()],
        "others_max_rel": max(others.values()),
    }


reference = {
    "config": CONFIG,
    "steps": STEPS,
    "depths": {str(d): {**gradient(d), "two_float_orders": spread(d)} for d in (2, 4)},
}
(Path(__file__).parent / "backout_reference.json").write_text(json.dumps(reference, indent=1) + "\n")
print(json.dumps(reference, indent=1), file=sys.stderr)
