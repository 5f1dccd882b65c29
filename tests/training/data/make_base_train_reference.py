"""Reference numbers of nanochat HEAD's pretraining (scripts/base_train.py at 92d63d4), executed; see README.md.

Runs HEAD's own `scripts/base_train.py` (runpy, in this process) on CPU in float32 on synthetic shards and a
tokenizer made by HEAD's `scripts/tok_train.py`, with recording wrappers around what it calls (nothing of its loop
is changed): the rows its train and val loaders hand out, the loss of every forward, the LR, momentum and weight
decay of every optimizer step, the val bpb of every evaluation, and its final weights. torch.compile is the
identity (eager: compiled float32 kernels round differently). Also executes HEAD's derivation of steps, batch and
accumulation (the same script's lines, extracted with ast) for d12, d20, d24 and d26 on its default arguments and the
speedrun's.
Usage: python make_base_train_reference.py   (needs /tmp/base-train/nc: HEAD's tree; see README.md)
"""

import ast
import io
import json
import math
import os
import runpy
import subprocess
import sys
import types
from contextlib import redirect_stdout
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanochat_hf.conversion import to_nanochat
from nanochat_hf.data.pretraining import write_synthetic_shards
from nanochat_hf.tokenizer.nanochat_format import load_nanochat_tokenizer

NC = Path("/tmp/base-train/nc")
BASE = Path("/tmp/base-train/base")
STUBS = Path("/tmp/base-train/stubs")  # wandb/__init__.py (base_train imports it; the run is "dummy")
# the run: HEAD's flags (its CPU example, smaller)
ARGV = [
    "--device-type=cpu",
    "--depth=2",
    "--aspect-ratio=16",
    "--head-dim=16",
    "--max-seq-len=64",
    "--window-pattern=SSSL",
    "--device-batch-size=2",
    "--total-batch-size=256",
    "--num-iterations=10",
    "--warmup-steps=3",
    "--warmdown-ratio=0.5",
    "--eval-every=4",
    "--eval-tokens=256",
    "--core-metric-every=-1",
    "--sample-every=-1",
    "--model-tag=ref",
]


def run_head() -> dict:
    import nanochat.dataloader as dl
    import nanochat.gpt as gpt
    import nanochat.loss_eval as le
    import nanochat.optim as optim

    torch.compile = lambda model, **kw: model  # eager
    rec = {"train_rows": [], "val_rows": [], "losses": [], "steps": [], "val_bpb": []}

    loader = dl.tokenizing_distributed_data_loader_with_state_bos_bestfit  # the val loader calls it too

    def recording(tokenizer, B, T, split, *a, **k):
        for item in loader(tokenizer, B, T, split, *a, **k):
            rec[f"{split}_rows"].append(torch.cat([item[0][:, :1], item[1]], 1).clone())  # the row: x[0], then y
            yield item

    dl.tokenizing_distributed_data_loader_with_state_bos_bestfit = recording
    forward = gpt.GPT.forward

    def fwd(self, idx, targets=None, kv_cache=None, loss_reduction="mean"):
        out = forward(self, idx, targets, kv_cache, loss_reduction)
        if targets is not None and loss_reduction == "mean" and self.training:
            rec["losses"].append(out.item())
        return out

    gpt.GPT.forward = fwd
    step = optim.MuonAdamW.step

    def ostep(self, *a, **k):
        muon = next(g for g in self.param_groups if g["kind"] == "muon")
        rec["steps"].append(
            {
                "lrm": muon["lr"] / muon["initial_lr"],
                "momentum": muon["momentum"],
                "weight_decay": muon["weight_decay"],
                "lrs": [g["lr"] for g in self.param_groups],
            }
        )
        return step(self, *a, **k)

    optim.MuonAdamW.step = ostep
    bpb = le.evaluate_bpb

    def ebpb(*a, **k):
        rec["val_bpb"].append(bpb(*a, **k))
        return rec["val_bpb"][-1]

    le.evaluate_bpb = ebpb
    init = gpt.GPT.init_weights

    def init_weights(self):
        init(self)
        rec["init"] = {k: v.detach().clone() for k, v in self.state_dict().items()}

    gpt.GPT.init_weights = init_weights
    sys.argv = ["base_train.py", *ARGV]
    out = io.StringIO()
    with redirect_stdout(out):
        g = runpy.run_path(str(NC / "scripts" / "base_train.py"), run_name="__main__")
    rec["printed"] = [line for line in out.getvalue().splitlines() if line.startswith("step ") and "loss:" in line]
    rec["final"] = {k: v.detach().clone() for k, v in g["orig_model"].state_dict().items()}
    rec["grad_accum_steps"], rec["num_iterations"] = g["grad_accum_steps"], g["num_iterations"]
    rec["total_batch_size"], rec["weight_decay_scaled"] = g["total_batch_size"], g["weight_decay_scaled"]
    rec["batch_lr_scale"], rec["num_flops_per_token"] = g["batch_lr_scale"], g["num_flops_per_token"]
    rec["param_counts"] = g["param_counts"]
    return rec


def derivation(depth: int, world: int, **flags) -> dict:
    """HEAD's lines from the model's size to grad_accum_steps (top-level statements of base_train.py, source
    segments by ast, executed as they are) with its GPT on the meta device, vocabulary 32768 (tok_train's default);
    the statements that touch storage, checkpoints, fp8 or compilation are left out."""
    from nanochat.gpt import GPT, GPTConfig

    src = (NC / "scripts" / "base_train.py").read_text()
    segments = [ast.get_source_segment(src, n) for n in ast.parse(src).body]
    first = next(i for i, s in enumerate(segments) if s.startswith("def build_model_meta"))
    stop = next(i for i, s in enumerate(segments) if "model.setup_optimizer" in s)
    skip = ("to_empty", "init_weights", "torch.compile", "if resuming", "if args.fp8", "get_base_dir", "disable_fp8")
    skip += ("output_dirname", "checkpoint_dir", "resuming =", 'print0(f"Model config')
    wanted = ("args.num_iterations > 0 or", "if args.num_iterations > 0", "total_tokens =", "tokens_per_fwdbwd =")
    wanted += ("total_batch_size % world_tokens", "grad_accum_steps =")
    code = [s for s in segments[first:stop] if not any(k in s for k in skip)]
    code += [s for s in segments[stop:] if any(s.startswith(k) or k in s.split("\n")[0] for k in wanted)]
    defaults = dict(
        aspect_ratio=64,
        head_dim=128,
        max_seq_len=2048,
        window_pattern="SSSL",
        num_iterations=-1,
        target_flops=-1.0,
        target_param_data_ratio=12,
        device_batch_size=32,
        total_batch_size=-1,
        weight_decay=0.28,
    )
    args = types.SimpleNamespace(depth=depth, **{**defaults, **flags})
    ns = {
        "args": args,
        "GPT": GPT,
        "GPTConfig": GPTConfig,
        "torch": torch,
        "math": math,
        "json": json,
        "print0": lambda *a: None,
        "asdict": lambda c: {},
        "vocab_size": 32768,
        "ddp_world_size": world,
    }
    for statement in code:
        exec(statement, ns)
    keys = ("num_scaling_params", "total_batch_size", "num_iterations", "grad_accum_steps", "batch_lr_scale")
    keys += ("weight_decay_scaled", "num_flops_per_token", "total_tokens")
    return {"depth": depth, "world_size": world, **flags, **{k: ns[k] for k in keys}}


def head_loads_ours(out: Path, tokens: torch.Tensor) -> dict:
    """Our base_train on HEAD's rows (tests/training/base_replay.py), its folder through `to_nanochat` into
    base_checkpoints/hf, read back by HEAD's `load_model("base")`: HEAD's logits of `tokens` and the meta it read."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from base_replay import train_replay
    from nanochat.checkpoint_manager import load_model

    (out / "base_train_reference.json").write_text(json.dumps({"argv": ARGV}))  # what train_replay reads first
    folder = BASE / "hf-run"
    trainer = train_replay(folder)
    to_nanochat(folder, BASE / "base_checkpoints" / "hf", tokenizer_output_dir=BASE / "hf-tokenizer", overwrite=True)
    model, _, meta = load_model("base", torch.device("cpu"), phase="eval", model_tag="hf")
    with torch.no_grad():
        logits = model(tokens)
        ours = trainer.model(input_ids=tokens).logits[..., : logits.shape[-1]]
    save_file({"logits": logits.contiguous()}, out / "base_train_head_logits.safetensors")
    return {
        "meta_keys": sorted(meta),
        "tokens": tokens.tolist(),
        "max_abs_diff_ours": (logits - ours).abs().max().item(),
    }


def main(out: Path) -> None:
    write_synthetic_shards(BASE / "base_data_climbmix", num_shards=3, docs_per_shard=120, row_group_size=30)
    env = {**os.environ, "NANOCHAT_BASE_DIR": str(BASE), "PYTHONPATH": f"{STUBS}:{NC}"}
    subprocess.run([sys.executable, "-m", "scripts.tok_train", "--vocab-size=320"], cwd=NC, env=env, check=True)
    os.environ.update(NANOCHAT_BASE_DIR=str(BASE), NANOCHAT_DTYPE="float32")
    sys.path[:0] = [str(STUBS), str(NC)]
    os.chdir(NC)
    rec = run_head()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"final.{k}": v.contiguous() for k, v in rec["final"].items()}
    tensors["train_rows"] = torch.stack(rec["train_rows"])
    tensors["val_rows"] = torch.stack(rec["val_rows"])
    tensors["token_bytes"] = torch.load(BASE / "tokenizer" / "token_bytes.pt", weights_only=True)
    save_file(tensors, out / "base_train_reference.safetensors")
    load_nanochat_tokenizer(BASE / "tokenizer", trust_pickle=True).save_pretrained(out / "base_train_tokenizer")
    init = {f"init.{k}": v.contiguous() for k, v in rec["init"].items()}
    save_file(init, out / "base_train_init.safetensors")
    ema, logged = 0.0, []
    ga = rec["grad_accum_steps"]
    for step in range(rec["num_iterations"]):  # HEAD's logging lines, on the last micro-step's loss
        ema = 0.9 * ema + 0.1 * rec["losses"][(step + 1) * ga - 1]
        logged.append(ema / (1 - 0.9 ** (step + 1)))
    printed = [float(line.split("loss: ")[1].split(" ")[0]) for line in rec["printed"]]
    assert all(abs(a - b) < 1e-6 for a, b in zip(printed, logged)) and len(printed) == len(logged), (printed, logged)
    table = [derivation(d, 8) for d in (12, 20, 24, 26)]
    table.append(derivation(24, 8, target_param_data_ratio=8, device_batch_size=16))  # runs/speedrun.sh
    table.append(derivation(3, 1, device_batch_size=4))  # 3 x 64 wide: rounded up to 2 heads of 128
    head_load = head_loads_ours(out, tensors["val_rows"][0, :1, :-1])
    json.dump(
        {
            "head_load": head_load,
            "argv": ARGV,
            "tokenizer_vocab_size": 320,
            "num_iterations": rec["num_iterations"],
            "grad_accum_steps": ga,
            "total_batch_size": rec["total_batch_size"],
            "batch_lr_scale": rec["batch_lr_scale"],
            "weight_decay_scaled": rec["weight_decay_scaled"],
            "num_flops_per_token": rec["num_flops_per_token"],
            "param_counts": rec["param_counts"],
            "micro_batch_losses": rec["losses"],
            "logged_loss": logged,
            "printed_loss": printed,
            "steps": rec["steps"],
            "val_bpb": rec["val_bpb"],
            "derivation": table,
        },
        open(out / "base_train_reference.json", "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(Path(__file__).resolve().parent)  # tests/training/base_replay.py reads the files from there
