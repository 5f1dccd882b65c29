"""Reference numbers for tests/training/test_sft_parity.py: nanochat's own code, executed (see README.md there).

- model: nanochat's December GPT (nanochat/gpt.py at 790f3be, the G0 generation our December model converts
  from), tiny, float32 on CPU, every weight set by `weights` below;
- rows: nanochat HEAD's SFT loader (`sft_data_generator_bos_bestfit` of scripts/chat_sft.py at 92d63d4, extracted
  with ast and executed) over the synthetic conversations of `conversation`;
- numbers: the loss nanochat's training loop computes on each micro-batch of one epoch (model(x, y), mean over
  the targets not ignored) and the validation bpb of HEAD's `evaluate_bpb` (nanochat/loss_eval.py at 92d63d4) over
  4 validation micro-batches with the token_bytes of `token_bytes`.
Usage (nanochat trees at /tmp/recipe-sft/g0 = 790f3be and /tmp/recipe-sft/nc = 92d63d4): python THIS OUT.json
"""

import ast
import json
import math
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

HEAD = Path("/tmp/recipe-sft/nc")
BOS, CAP, B, T, N, V, EVAL_STEPS = 1, 65, 4, 64, 120, 60, 4
CONFIG = {"sequence_len": 64, "vocab_size": 512, "n_layer": 2, "n_head": 2, "n_kv_head": 2, "n_embd": 64}


def source(path, name):
    text = path.read_text()
    return next(ast.get_source_segment(text, n) for n in ast.parse(text).body if getattr(n, "name", None) == name)


def conversation(i):
    length = 3 + (i * 37 + (i * i) % 17) % (CAP - 3)
    prompt = 1 + (i * 11) % max(1, length - 1)
    ids = [BOS] + [4 + (i * 31 + j * 17) % 500 for j in range(1, length)]
    return ids, [0] * prompt + [1] * (length - prompt)


def weights(state_dict):
    """Every tensor, in name order k: 0.05 * sin(0.731 * arange(numel) + k), float32."""
    for k, name in enumerate(sorted(state_dict)):
        p = state_dict[name]
        flat = 0.05 * torch.sin(torch.arange(p.numel(), dtype=torch.float64) * 0.731 + k)
        p.copy_(flat.reshape(p.shape).to(p.dtype))


def token_bytes():
    return torch.tensor([0] * 4 + [t % 5 for t in range(4, CONFIG["vocab_size"])], dtype=torch.int64)


class Tok:
    def get_bos_token_id(self):
        return BOS

    def render_conversation(self, conv):
        return conversation(conv)


if __name__ == "__main__":
    sys.path.insert(0, "/tmp/recipe-sft/g0")
    # nanochat's December model, imported here: the test imports this file for its formulas
    from nanochat.gpt import GPT, GPTConfig

    g = {
        "torch": torch,
        "args": types.SimpleNamespace(max_seq_len=T, device_batch_size=B, num_iterations=-1),
        "train_dataset": list(range(N)),
        "val_dataset": list(range(N, N + V)),
        "tokenizer": Tok(),
        "ddp_rank": 0,
        "ddp_world_size": 1,
        "device_type": "cpu",
        "device": "cpu",
        "last_step": False,
        "approx_progress": 0.0,
        "current_epoch": 1,
    }
    exec(source(HEAD / "scripts" / "chat_sft.py", "sft_data_generator_bos_bestfit"), g)  # noqa: S102
    e = {"torch": torch, "math": math, "dist": dist}
    exec(source(HEAD / "nanochat" / "loss_eval.py", "evaluate_bpb"), e)  # noqa: S102
    with torch.device("meta"):
        model = GPT(GPTConfig(**CONFIG))
    model.to_empty(device="cpu")
    model.init_weights()
    with torch.no_grad():
        weights(model.state_dict())
    model.eval()
    losses = []
    with torch.no_grad():
        loader = g["sft_data_generator_bos_bestfit"]("train")
        x, y = next(loader)
        while not g["last_step"]:  # chat_sft.py with G = 1: loss of the prefetched batch, then the next draw
            losses.append(model(x, y).item())
            x, y = next(loader)
        model.get_device = lambda: torch.device("cpu")
        val_bpb = e["evaluate_bpb"](model, g["sft_data_generator_bos_bestfit"]("val"), EVAL_STEPS, token_bytes())
    out = {
        "config": CONFIG,
        "B": B,
        "T": T,
        "N": N,
        "V": V,
        "eval_steps": EVAL_STEPS,
        "losses": losses,
        "val_bpb": val_bpb,
    }
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    print(len(losses), losses[:3], val_bpb)
