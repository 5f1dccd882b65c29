"""Reference numbers of nanochat HEAD's SFT loader and LR schedule (scripts/chat_sft.py at 92d63d4); see README.md.

Runs nanochat's own `sft_data_generator_bos_bestfit` and `get_lr_multiplier` (source extracted verbatim with ast
from /tmp/recipe-sft/nc/scripts/chat_sft.py, executed with stubbed globals) over synthetic conversations.
Usage: python make_bestfit_reference.py OUT.json
"""

import ast
import hashlib
import json
import sys
import types
from pathlib import Path

import torch

SRC = Path("/tmp/recipe-sft/nc/scripts/chat_sft.py").read_text()
FUNCS = {n.name: ast.get_source_segment(SRC, n) for n in ast.parse(SRC).body if isinstance(n, ast.FunctionDef)}
BOS = 1


def conversation(i, cap):
    """Conversation i: BOS, then length-1 tokens equal to 10 + i; the first `prompt` tokens are not targets.
    Lengths 3..cap-1 (cap = max_seq_len + 1: every conversation fits a row, as nanochat's loader needs)."""
    length = 3 + (i * 37 + (i * i) % 17) % (cap - 3)
    prompt = 1 + (i * 11) % max(1, length - 1)
    return [BOS] + [10 + i] * (length - 1), [0] * prompt + [1] * (length - prompt)


class Tok:
    def __init__(self, cap):
        self.cap = cap

    def get_bos_token_id(self):
        return BOS

    def render_conversation(self, conv):
        return conversation(conv, self.cap)


def encode(x, y):
    """A micro-batch as its rows' conversations (index per run of tokens, "B" = padding) and a hash."""
    rows = []
    for r in range(x.shape[0]):
        runs, prev = [], None
        for t in x[r].tolist():
            if t == BOS:
                runs.append("B")
                prev = None
            elif t != prev:
                runs.append(t - 10)
                prev = t
        # a BOS followed by its tokens is one conversation; a BOS followed by BOS (or the end) is padding
        rows.append([c for i, c in enumerate(runs) if c != "B" or i + 1 == len(runs) or runs[i + 1] == "B"])
    sha = hashlib.sha256(x.to(torch.int64).numpy().tobytes() + y.to(torch.int64).numpy().tobytes()).hexdigest()
    return {"rows": rows, "sha": sha[:16]}


def run(N, V, B, T, W, G, warmdown=0.5):
    ranks = []
    for r in range(W):
        g = {
            "torch": torch,
            "args": types.SimpleNamespace(
                max_seq_len=T,
                device_batch_size=B,
                num_iterations=-1,
                warmup_ratio=0.0,
                warmdown_ratio=warmdown,
                final_lr_frac=0.0,
            ),
            "train_dataset": list(range(N)),
            "val_dataset": list(range(N, N + V)),
            "tokenizer": Tok(T + 1),
            "ddp_rank": r,
            "ddp_world_size": W,
            "device_type": "cpu",
            "device": "cpu",
            "last_step": False,
            "approx_progress": 0.0,
            "current_epoch": 1,
        }
        exec(FUNCS["sft_data_generator_bos_bestfit"], g)  # noqa: S102 -- nanochat's own code, on purpose
        exec(FUNCS["get_lr_multiplier"], g)  # noqa: S102
        ranks.append(g)
    loaders = [g["sft_data_generator_bos_bestfit"]("train") for g in ranks]
    batches = [[] for _ in range(W)]

    def draw():
        for r in range(W):
            batches[r].append(next(loaders[r]))

    draw()  # chat_sft.py prefetches the first micro-batch before the loop
    progress, lrms, progresses, step = [0.0] * W, [], [], 0
    while not any(g["last_step"] for g in ranks):  # last_step is all-reduced (MAX) at the top of each step
        for _ in range(G):  # a draw after each micro-step's backward
            draw()
            progress = [max(p, g["approx_progress"]) for p, g in zip(progress, ranks)]
        lrms.append([g["get_lr_multiplier"](p) for g, p in zip(ranks, progress)])
        progresses.append(list(progress))
        step += 1
    val = []
    for g in ranks:  # build_val_loader(): a fresh generator per evaluation
        loader = g["sft_data_generator_bos_bestfit"]("val")
        val.append([encode(*next(loader)) for _ in range(4)])
    return {
        "steps": step,
        "lrm": lrms,
        "progress": progresses,
        "val": val,
        "train": [[encode(x, y) for x, y in b] for b in batches],
    }


if __name__ == "__main__":
    cases = {}
    for name, kw in {
        "w1_g2": {"N": 300, "V": 120, "B": 4, "T": 64, "W": 1, "G": 2},
        "w2_g1": {"N": 301, "V": 121, "B": 3, "T": 64, "W": 2, "G": 1},
        "w1_g1_t100": {"N": 250, "V": 100, "B": 2, "T": 100, "W": 1, "G": 1},
    }.items():
        cases[name] = {"config": kw, **run(**kw)}
        print(name, "steps", cases[name]["steps"], "micro-batches", len(cases[name]["train"][0]))
    Path(sys.argv[1]).write_text(json.dumps(cases, separators=(",", ":")))
