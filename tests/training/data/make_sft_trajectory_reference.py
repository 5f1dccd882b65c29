"""Reference trajectory for tests/training/test_sft_parity.py: nanochat's chat_sft.py training loop, executed.

One epoch of nanochat HEAD's SFT loop (scripts/chat_sft.py at 92d63d4, grad accumulation 1) on the tiny December
GPT, rows and weights of make_sft_parity_reference.py: HEAD's `MuonAdamW` (nanochat/optim.py at 92d63d4, its
torch.compile decorators removed so it runs eagerly on CPU, COMPUTE_DTYPE float32) with the groups of HEAD's
`setup_optimizer` that a December model has (lm_head and wte AdamW, the block matrices Muon by shape; weight decay
0 for Muon, as chat_sft.py passes), LRs x init_lr_frac 0.8, `get_lr_multiplier` (warmdown 0.5),
`get_muon_momentum`, the debiased EMA of the loss it logs, and `evaluate_bpb` at step 0 and at the last step.
Usage (nanochat trees as in make_sft_parity_reference.py): python THIS OUT.json
"""

import ast
import json
import math
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import make_sft_parity_reference as ref  # noqa: E402 -- conversation, weights, token_bytes, loader source

LR = {"embedding_lr": 0.2, "unembedding_lr": 0.004, "matrix_lr": 0.02}
INIT_LR_FRAC, WARMDOWN = 0.8, 0.5


def head_muon_adamw():
    text = (ref.HEAD / "nanochat" / "optim.py").read_text()
    text = text.replace("@torch.compile(dynamic=False, fullgraph=True)\n", "")
    text = text.replace("from nanochat.common import COMPUTE_DTYPE\n", "COMPUTE_DTYPE = torch.float32\n")
    namespace: dict = {}
    exec(compile(text, "nanochat/optim.py", "exec"), namespace)  # noqa: S102 -- nanochat's own code, on purpose
    return namespace["MuonAdamW"]


def chat_sft_functions(g: dict) -> None:
    text = (ref.HEAD / "scripts" / "chat_sft.py").read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in (
            "sft_data_generator_bos_bestfit",
            "get_lr_multiplier",
            "get_muon_momentum",
        ):
            exec(ast.get_source_segment(text, node), g)  # noqa: S102


if __name__ == "__main__":
    sys.path.insert(0, "/tmp/recipe-sft/g0")
    from nanochat.gpt import GPT, GPTConfig

    g = {
        "torch": torch,
        "args": types.SimpleNamespace(
            max_seq_len=ref.T,
            device_batch_size=ref.B,
            num_iterations=-1,
            warmup_ratio=0.0,
            warmdown_ratio=WARMDOWN,
            final_lr_frac=0.0,
        ),
        "train_dataset": list(range(ref.N)),
        "val_dataset": list(range(ref.N, ref.N + ref.V)),
        "tokenizer": ref.Tok(),
        "ddp_rank": 0,
        "ddp_world_size": 1,
        "device_type": "cpu",
        "device": "cpu",
        "last_step": False,
        "approx_progress": 0.0,
        "current_epoch": 1,
    }
    chat_sft_functions(g)
    e = {"torch": torch, "math": math, "dist": dist}
    exec(ref.source(ref.HEAD / "nanochat" / "loss_eval.py", "evaluate_bpb"), e)  # noqa: S102
    with torch.device("meta"):
        model = GPT(GPTConfig(**ref.CONFIG))
    model.to_empty(device="cpu")
    model.init_weights()
    with torch.no_grad():
        ref.weights(model.state_dict())
    model.get_device = lambda: torch.device("cpu")
    scale = (ref.CONFIG["n_embd"] / 768) ** -0.5
    matrices = list(model.transformer.h.parameters())
    groups = [
        dict(
            kind="adamw",
            params=list(model.lm_head.parameters()),
            lr=LR["unembedding_lr"] * scale,
            betas=(0.8, 0.96),
            eps=1e-10,
            weight_decay=0.01,
        ),
        dict(
            kind="adamw",
            params=list(model.transformer.wte.parameters()),
            lr=LR["embedding_lr"] * scale,
            betas=(0.8, 0.995),
            eps=1e-10,
            weight_decay=0.001,
        ),
    ] + [
        dict(
            kind="muon",
            params=[p for p in matrices if p.shape == shape],
            lr=LR["matrix_lr"],
            momentum=0.95,
            ns_steps=5,
            beta2=0.9,
            weight_decay=0.0,
        )
        for shape in sorted({p.shape for p in matrices})
    ]
    optimizer = head_muon_adamw()(groups)
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * INIT_LR_FRAC
        group["initial_lr"] = group["lr"]

    def val_bpb():
        model.eval()
        bpb = e["evaluate_bpb"](model, g["sft_data_generator_bos_bestfit"]("val"), ref.EVAL_STEPS, ref.token_bytes())
        model.train()
        return bpb

    loader = g["sft_data_generator_bos_bestfit"]("train")
    x, y = next(loader)
    steps, bpbs, smooth, progress, step = [], {0: val_bpb()}, 0.0, 0.0, 0
    while not g["last_step"]:
        loss = model(x, y)
        train_loss = loss.detach()
        loss.backward()
        x, y = next(loader)
        progress = max(progress, g["approx_progress"])
        lrm = g["get_lr_multiplier"](progress)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group["kind"] == "muon":
                group["momentum"] = g["get_muon_momentum"](step)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        step += 1
        smooth = 0.9 * smooth + 0.1 * train_loss.item()
        steps.append({"step": step, "loss": smooth / (1 - 0.9 ** (step + 1)), "lrm": lrm})
    bpbs[step] = val_bpb()
    out = {"lr": LR, "init_lr_frac": INIT_LR_FRAC, "warmdown_ratio": WARMDOWN, "steps": steps, "val_bpb": bpbs}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    print(len(steps), steps[0], steps[-1], bpbs)
