"""The recipe's point, measured: Muon + AdamW against AdamW alone, on the demo model and the offline demo mixture;
and the two optimizer recipes against each other (December 2025 and nanochat HEAD's, `--recipes 2025-12,2026-07`).

    python benchmarks/convergence.py [--steps 80] [--eval_every 5] [--lrs 0.0003,0.001,0.003,0.01]
                                     [--recipes 2025-12,2026-07] [--output convergence.json]
                                     [--MidTrainingArguments flag value ...]
    python benchmarks/convergence.py --model llama|mixtral|phi3 [--steps 120] [--eval_every 10] [--split]
                                     [--output llama.json]

Arms, all trained by `MidTrainer` through `nanochat_hf.training.run` (`build_trainer`, `train`):
- "muon": the recipe, Muon on the block matrices at matrix_lr, AdamW on embedding and lm_head at the demo's rates;
- "muon 2026-07" (with --recipes ...,2026-07): the same rates in optimizer recipe 2026-07 (nanochat HEAD's
  MuonAdamW: its groups, betas and weight decays, Polar Express, NorMuon, cautious weight decay);
- "adamw lr=X", one per --lrs value: every parameter in AdamW (`build_optimizer(matrix_optimizer="adamw")`), the
  block matrices at X, embedding and lm_head at the same rates as in the recipe.
Every arm starts from the same initial weights and reads the same batches in the same order, under the same LR
schedule (constant, then linear to 0 over the last 20% of the steps), with 1 torch thread; val bpb is recorded at
every evaluation (step 0, every --eval_every steps, the last step).

``--model llama`` (nanochat's optimizer on another architecture): a SmolLM2-shaped Llama scaled down (width 192,
4 layers, 3 heads of 64, 1 KV head, MLP 512, tied embeddings, random init) on the same demo mixture, trained by a
plain loop: arms "muon 2025-12" and "muon 2026-07" (`build_optimizer` at its default rates, routed by role) against
torch.optim.AdamW on every parameter at each of --lrs (default 0.001,0.003,0.01: half-decades around the usual rate
of a small Llama), the same schedule (constant, linear to 0 over the last 20%), batches and initial weights; then
the optimizer step time of both recipes against torch.optim.Muon (the hidden matrices) + torch.optim.AdamW (the
rest) on the same model and gradients, 1 thread. ``--model mixtral``: the same shape with a Mixtral MoE MLP (4
experts of 256, top 2; the experts are Muon matrices); ``--model phi3``: the same shape as Phi3 (fused qkv_proj and
gate_up_proj). ``--split``: also each recipe with ``split_fused=True`` ("muon <recipe> split": the fused
projections' blocks orthogonalised separately), and a line of the steps each takes to its whole arm's final val
bpb. Each arm also reports its train loss (mean of the last 10% of its steps' losses).

The table: each arm's final val bpb, the first evaluated step at which its val bpb is at or below the best AdamW
arm's final val bpb (the target), and that step divided by the best AdamW arm's own. With both recipes, one more
line: the steps each recipe takes to the December arm's final val bpb. Other flags are passed to
`MidTrainingArguments` on top of the demo config (e.g. --max_seq_len 64 for a quick run).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time

import torch
from transformers import TrainerCallback

import nanochat_hf  # noqa: F401  (registers the Auto classes)
from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.atomic import write_text
from nanochat_hf.data import demo_tokenizer, load_mixture, tokenize_conversations
from nanochat_hf.integration.gradients import clip_in_optimizer
from nanochat_hf.optim import RECIPES, build_optimizer
from nanochat_hf.tokenizer.chat_format import EOS_TOKEN
from nanochat_hf.training.arguments import parse_args
from nanochat_hf.training.callbacks import NanoChatConsole
from nanochat_hf.training.run import build_trainer, train

# Half-decade steps from 0.01, the order of nanochat's AdamW rate for a matrix (lm_head: unembedding_lr 0.004,
# 0.0069 once scaled to width 256), down to 0.0003: in a first 80-step demo run 0.001 finished ahead of 0.003, and
# 0.01 was behind both at step 5 (where that run was stopped), so the best rate needed a neighbour below it.
DEFAULT_LRS = "0.0003,0.001,0.003,0.01"
# --model llama: torch.optim.AdamW on every parameter, half-decades around 0.003 (SmolLM2-135M's peak rate)
LLAMA_LRS = "0.001,0.003,0.01"
LLAMA = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
             tie_word_embeddings=True, rope_theta=100000.0)  # fmt: skip
LLAMA_ROWS, LLAMA_SEQ, LLAMA_VAL_ROWS, TIMED_STEPS = 8, 128, 32, 10
# the other --model shapes: LLAMA's, with a Mixtral MoE MLP (4 experts of 256, top 2) or as Phi3 (fused projections)
HF_MODELS = {
    "llama": ("LlamaConfig", LLAMA),
    "mixtral": ("MixtralConfig", {**LLAMA, "intermediate_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "phi3": ("Phi3Config", {**LLAMA, "pad_token_id": None}),
}


class EvalPrinter(TrainerCallback):
    """One line per evaluation (the per-step console lines of five runs would bury them)."""

    def __init__(self, arm: str):
        self.arm = arm

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        print(f"  {self.arm:<16} step {state.global_step:5d}  val bpb {metrics['eval_val_bpb']:.4f}", flush=True)


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=80, help="optimizer steps per arm")
    p.add_argument("--eval_every", type=int, default=5, help="evaluate val bpb every N steps (and at 0 and the end)")
    p.add_argument("--lrs", default=None, help=f"comma list of AdamW rates for the block matrices ({DEFAULT_LRS}; "
                   f"--model llama: for every parameter, {LLAMA_LRS})")  # fmt: skip
    p.add_argument("--depth", type=int, default=4, help="model depth (nanochat's rule: width 64*depth)")
    p.add_argument("--output", default=None, help="JSON file of the curves (rewritten after every arm)")
    p.add_argument("--recipes", default=None, help=f"comma list of optimizer recipes for Muon arms ({RECIPES}; "
                   "default 2025-12, --model llama both)")  # fmt: skip
    p.add_argument("--model", choices=("nanochat", *HF_MODELS), default="nanochat", help="see the module docstring")
    p.add_argument("--split", action="store_true", help="also the Muon arms with split_fused=True (fused models)")
    a, rest = p.parse_known_args(argv)
    llama = a.model != "nanochat"
    if llama and rest:
        p.error(f"--model {a.model} takes no MidTrainingArguments flags, got {rest}")
    a.lrs = a.lrs or (LLAMA_LRS if llama else DEFAULT_LRS)
    a.recipes = a.recipes or (",".join(RECIPES) if llama else "2025-12")
    a.recipes = [x.strip() for x in a.recipes.split(",") if x.strip()]
    if not a.recipes or set(a.recipes) - set(RECIPES):
        p.error(f"--recipes {a.recipes}: expected a comma list of {', '.join(RECIPES)}")
    try:
        a.lrs = [float(x) for x in a.lrs.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lrs {a.lrs!r}: expected a comma list of numbers, e.g. {DEFAULT_LRS}")
    if not a.lrs or min(a.lrs) <= 0:
        p.error(f"--lrs {a.lrs}: expected at least one positive rate")
    if a.steps <= 0 or a.eval_every <= 0:
        p.error("--steps and --eval_every must be positive")
    return a, rest


def first_step_at_or_below(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((step for step, bpb in curve if bpb <= target), None)


def summarize(arms: list[dict]) -> dict:
    """Target = the best AdamW arm's final val bpb; each arm's steps to reach it and the ratio to that arm's."""
    adamw = [a for a in arms if a["optimizer"] == "adamw"]
    best = min(adamw, key=lambda a: a["final_val_bpb"])
    target = best["final_val_bpb"]
    reference = first_step_at_or_below(best["curve"], target)
    for arm in arms:
        steps = first_step_at_or_below(arm["curve"], target)
        arm["steps_to_target"] = steps
        arm["ratio"] = steps / reference if steps is not None and reference else None
    summary = {"best_adamw": best["name"], "target_val_bpb": target, "best_adamw_steps": reference}
    recipes = {a.get("recipe"): a for a in arms if a["optimizer"] == "muon" and not a.get("split_fused")}
    if {"2025-12", "2026-07"} <= set(recipes):  # both recipes to the December arm's final val bpb
        december = recipes["2025-12"]["final_val_bpb"]
        summary["recipes"] = {
            "target_val_bpb": december,
            **{r: first_step_at_or_below(recipes[r]["curve"], december) for r in ("2025-12", "2026-07")},
        }
    for arm in arms:  # split_fused: steps of the whole arm and of the split arm to the whole arm's final val bpb
        if arm.get("split_fused"):
            whole = recipes[arm["recipe"]]
            target = whole["final_val_bpb"]
            summary.setdefault("split", {})[arm["recipe"]] = {
                "target_val_bpb": target,
                "whole": first_step_at_or_below(whole["curve"], target),
                "split": first_step_at_or_below(arm["curve"], target),
            }
    return summary


def table(arms: list[dict], summary: dict) -> str:
    lines = [
        f"target: {summary['target_val_bpb']:.4f} val bpb = final of the best AdamW arm ({summary['best_adamw']})",
        f"{'arm':<21} {'final val bpb':>13} {'steps to target':>15} {'/ best AdamW':>12} {'train loss':>10}",
    ]
    for a in arms:
        steps = "not reached" if a["steps_to_target"] is None else str(a["steps_to_target"])
        ratio = "-" if a["ratio"] is None else f"{a['ratio']:.2f}"
        train = f"{a['final_train_loss']:.4f}" if "final_train_loss" in a else "-"
        lines.append(f"{a['name']:<21} {a['final_val_bpb']:>13.4f} {steps:>15} {ratio:>12} {train:>10}")
    if "recipes" in summary:
        r = summary["recipes"]
        head = "not reached" if r["2026-07"] is None else r["2026-07"]
        lines.append(
            f"recipes, steps to {r['target_val_bpb']:.4f} val bpb (the December arm's final): 2025-12 "
            f"{r['2025-12']}, 2026-07 {head}"
        )
    for recipe, r in summary.get("split", {}).items():
        split = "not reached" if r["split"] is None else r["split"]
        lines.append(
            f"split_fused, recipe {recipe}: steps to {r['target_val_bpb']:.4f} val bpb (the whole arm's final): "
            f"whole {r['whole']}, split {split}"
        )
    return "\n".join(lines)


def run_arm(
    name: str, matrix_lr: float | None, args, model, tokenizer, train_tokens, val_tokens, recipe: str = "2025-12"
) -> dict:
    """Train a copy of `model`: the optimizer of ``recipe`` (matrix_lr None) or AdamW everywhere at matrix_lr."""
    t0 = time.time()
    trainer = build_trainer(args, copy.deepcopy(model), tokenizer, train_tokens, val_tokens)
    trainer.pop_callback(NanoChatConsole)
    trainer.add_callback(EvalPrinter(name))
    if matrix_lr is not None:  # the Trainer takes a given optimizer as is (its create_optimizer then does nothing)
        trainer.optimizer = build_optimizer(
            trainer.model,
            matrix_lr=matrix_lr,
            embedding_lr=args.embedding_lr,
            unembedding_lr=args.unembedding_lr,
            weight_decay=args.weight_decay,
            init_lr_frac=args.init_lr_frac,
            matrix_optimizer="adamw",
        )
        clip_in_optimizer(trainer.optimizer, args.max_grad_norm)
    elif recipe != "2025-12":
        trainer.optimizer = build_optimizer(
            trainer.model,
            matrix_lr=args.matrix_lr,
            embedding_lr=args.embedding_lr,
            unembedding_lr=args.unembedding_lr,
            weight_decay=args.weight_decay,
            init_lr_frac=args.init_lr_frac,
            recipe=recipe,
        )
        clip_in_optimizer(trainer.optimizer, args.max_grad_norm)
    train(trainer)
    curve = [(h["step"], h["eval_val_bpb"]) for h in trainer.state.log_history if "eval_val_bpb" in h]
    result = {
        "name": name,
        "optimizer": "muon" if matrix_lr is None else "adamw",
        "recipe": recipe,
        "matrix_lr": args.matrix_lr if matrix_lr is None else matrix_lr,
        "final_val_bpb": curve[-1][1],
        "curve": curve,
        "wall_s": round(time.time() - t0, 1),
    }
    del trainer
    gc.collect()
    return result


def _rows(tokens, n: int, offset: int = 0) -> torch.Tensor:
    """n rows of LLAMA_SEQ + 1 tokens cut from the tokenized mixture's stream, from row ``offset`` (wrapping)."""
    stream = torch.tensor([t for ids in tokens["input_ids"] for t in ids])
    per = LLAMA_SEQ + 1
    total = stream.numel() // per
    rows = stream[: total * per].view(total, per)
    return rows[[(offset + i) % total for i in range(n)]]


@torch.no_grad()
def _val_bpb(model, val: torch.Tensor, token_bytes: torch.Tensor) -> float:
    logits = model(input_ids=val[:, :-1]).logits.float()
    nats = torch.nn.functional.cross_entropy(logits.flatten(0, 1), val[:, 1:].flatten(), reduction="none")
    nb = token_bytes[val[:, 1:].flatten()]
    return (nats * (nb > 0)).sum().item() / (math.log(2) * nb.sum().item())


def _llama_optimizer(name: str, model, lr: float | None, recipe: str, split: bool = False):
    if lr is not None:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    return build_optimizer(model, recipe=recipe, split_fused=split)


def _torch_muon_adamw(model):
    """torch.optim.Muon on the matrices our routing sends to Muon, torch.optim.AdamW on the rest (the step-time
    baseline); torch's Muon takes 2-D parameters only, so a MoE's 3-D expert stacks go to its AdamW."""
    matrices = {
        id(p) for r in build_optimizer(model).param_groups if r["kind"] == "muon" for p in r["params"] if p.ndim == 2
    }
    muon = torch.optim.Muon([p for p in model.parameters() if id(p) in matrices], lr=0.02)
    adamw = torch.optim.AdamW([p for p in model.parameters() if id(p) not in matrices], lr=0.003)
    return muon, adamw


def step_times(model, data: torch.Tensor) -> dict[str, float]:
    """Mean seconds of one optimizer step (TIMED_STEPS steps after one untimed) on the same gradients."""
    model.zero_grad(set_to_none=True)
    model(input_ids=data[:, :-1], labels=data[:, :-1]).loss.backward()  # labels shift inside the model
    candidates = {
        "nanochat 2025-12": [build_optimizer(model)],
        "nanochat 2026-07": [build_optimizer(model, recipe="2026-07")],
        "torch Muon + AdamW": list(_torch_muon_adamw(model)),
    }
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    times = {}
    for name, optimizers in candidates.items():
        for i in range(TIMED_STEPS + 1):
            if i == 1:
                t0 = time.perf_counter()
            for opt in optimizers:
                opt.step()
        times[name] = (time.perf_counter() - t0) / TIMED_STEPS
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
    return times


def llama_main(a: argparse.Namespace, argv: list[str] | None) -> dict:
    import transformers
    from transformers import AutoModelForCausalLM

    from nanochat_hf.integration.momentum import muon_momentum
    from nanochat_hf.tokenizer import token_bytes as compute_token_bytes
    from nanochat_hf.training.schedule import lr_multiplier

    torch.set_num_threads(1)
    tokenizer = demo_tokenizer()
    train_tokens, val_tokens = (
        tokenize_conversations(load_mixture(None, split=s), tokenizer, max_tokens=2048) for s in ("train", "val")
    )
    val = _rows(val_tokens, LLAMA_VAL_ROWS)
    token_bytes = compute_token_bytes(tokenizer)
    config_class, shape = HF_MODELS[a.model]
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), max_position_embeddings=LLAMA_SEQ, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    print(
        f"convergence --model {a.model}: width {LLAMA['hidden_size']}, {LLAMA['num_hidden_layers']} layers, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, {a.steps} steps of {LLAMA_ROWS}x{LLAMA_SEQ} "
        f"tokens, eval every {a.eval_every}, 1 thread",
        flush=True,
    )
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/convergence.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{platform.machine()}, 1 torch thread, torch {torch.__version__}",
        "load": os.getloadavg(),
        "settings": {"model": a.model, **shape, "rows": LLAMA_ROWS, "seq": LLAMA_SEQ, "steps": a.steps},
        "arms": [],
    }
    plan = [(f"muon {r}", None, r, False) for r in a.recipes]
    plan += [(f"muon {r} split", None, r, True) for r in a.recipes if a.split]
    plan += [(f"adamw lr={lr:g}", lr, "-", False) for lr in a.lrs]
    for name, lr, recipe, split in plan:
        t0 = time.time()
        arm = copy.deepcopy(model)
        opt = _llama_optimizer(name, arm, lr, recipe, split)
        if lr is None and (name == plan[0][0] or split):
            print(opt.routing.table(), flush=True)
        base = [g["lr"] for g in opt.param_groups]
        curve, losses = [(0, _val_bpb(arm, val, token_bytes))], []
        for step in range(a.steps):
            for g, lr0 in zip(opt.param_groups, base):
                g["lr"] = lr0 * lr_multiplier(step / a.steps)
            if lr is None:
                opt.set_muon_momentum(muon_momentum(step))
            batch = _rows(train_tokens, LLAMA_ROWS, step * LLAMA_ROWS)
            loss = arm(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
            if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
                curve.append((step + 1, _val_bpb(arm, val, token_bytes)))
                print(f"  {name:<16} step {step + 1:5d}  val bpb {curve[-1][1]:.4f}", flush=True)
        optimizer = "adamw" if lr is not None else "muon"
        report["arms"].append(
            {
                "name": name,
                "optimizer": optimizer,
                "recipe": recipe,
                "matrix_lr": lr,
                "split_fused": split,
                "final_val_bpb": curve[-1][1],
                "final_train_loss": sum(losses[-max(1, a.steps // 10) :]) / max(1, a.steps // 10),
                "curve": curve,
                "wall_s": round(time.time() - t0, 1),
            }  # fmt: skip
        )
        if a.output:
            write_text(a.output, json.dumps(report, indent=1) + "\n")
    report["summary"] = summarize(report["arms"])
    report["step_seconds"] = step_times(copy.deepcopy(model), _rows(train_tokens, LLAMA_ROWS))
    if a.output:
        write_text(a.output, json.dumps(report, indent=1) + "\n")
    print(table(report["arms"], report["summary"]))
    base = report["step_seconds"]["torch Muon + AdamW"]
    print(f"{'optimizer step':<20} {'ms':>8} {'/ torch':>8}")
    for name, seconds in report["step_seconds"].items():
        print(f"{name:<20} {seconds * 1000:>8.2f} {seconds / base:>8.2f}")
    print(f"load (uptime): {' '.join(f'{x:.2f}' for x in report['load'])}")
    return report


def main(argv: list[str] | None = None) -> dict:
    a, rest = parse(argv)
    if a.model != "nanochat":
        return llama_main(a, argv)
    with tempfile.TemporaryDirectory() as tmp:  # dry_run writes nothing; the Trainer still wants an output_dir
        # 1 thread and eager unless asked otherwise: every arm would pay the compile again, and the curves do not
        # depend on it
        given = {x.split("=")[0] for x in rest}
        defaults = [
            x
            for flag, value in (("--num_threads", "1"), ("--torch_compile", "false"))
            if flag not in given
            for x in (flag, value)
        ]
        args = parse_args(
            [
                *rest,
                "--num_iterations",
                str(a.steps),
                "--eval_every",
                str(a.eval_every),
                "--dry_run",
                "true",
                "--output_dir",
                tmp,
                "--disable_tqdm",
                "true",
                *defaults,
            ]
        )
        torch.set_num_threads(args.num_threads)
        tokenizer = demo_tokenizer()
        config = NanoChatGPTConfig.from_depth(
            a.depth,
            vocab_size=len(tokenizer),
            sequence_len=max(1024, args.max_seq_len),
            bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        )
        torch.manual_seed(args.seed)
        model = NanoChatGPTForCausalLM(config)  # every arm trains a copy: the same initial weights
        tokenizer.model_max_length = config.sequence_len
        # as run.setup does; the mixtures default to the offline demo's (train_mixture / val_mixture None)
        train_tokens, val_tokens = (
            tokenize_conversations(load_mixture(path, split=s), tokenizer, max_tokens=2048, assistant_only=False)
            for path, s in ((args.train_mixture, "train"), (args.val_mixture or args.train_mixture, "val"))
        )
        print(
            f"convergence: depth {a.depth} (width {config.n_embd}, {config.n_head} heads), {a.steps} steps of "
            f"{args.total_batch_size} tokens ({args.device_batch_size}x{args.max_seq_len}), eval every "
            f"{a.eval_every}, {args.num_threads} thread(s)",
            flush=True,
        )
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/convergence.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}",
            "settings": {
                "depth": a.depth,
                "n_embd": config.n_embd,
                "n_head": config.n_head,
                "steps": a.steps,
                "eval_every": a.eval_every,
                "total_batch_size": args.total_batch_size,
                "device_batch_size": args.device_batch_size,
                "max_seq_len": args.max_seq_len,
                "eval_tokens": args.eval_tokens,
                "seed": args.seed,
                "matrix_lr": args.matrix_lr,
                "embedding_lr": args.embedding_lr,
                "unembedding_lr": args.unembedding_lr,
            },
            "arms": [],
        }
        plan = [("muon" if r == "2025-12" else f"muon {r}", None, r) for r in a.recipes]
        plan += [(f"adamw lr={lr:g}", lr, "2025-12") for lr in a.lrs]
        for name, lr, recipe in plan:
            report["arms"].append(run_arm(name, lr, args, model, tokenizer, train_tokens, val_tokens, recipe))
            if a.output:  # after every arm: a long run stopped early keeps what it measured
                write_text(a.output, json.dumps(report, indent=1) + "\n")
    report["summary"] = summarize(report["arms"])
    if a.output:
        write_text(a.output, json.dumps(report, indent=1) + "\n")
    print(table(report["arms"], report["summary"]))
    return report


if __name__ == "__main__":
    main()
