"""End-of-run markdown report (config, final metrics, loss/bpb plot) and the model card."""

from __future__ import annotations

import io
import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from ..atomic import write_bytes, write_text
from ..data.mixture import read_mixture
from ..evaluation import model_index_results, results_table, write_report_section
from ..model import NanoChatGPTConfig
from ..tasks import MIXTURE_TASKS
from .checkpoint.layout import CURVES_FILE, MODEL_CARD_FILE, REPORT_FILE


def _history(trainer) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    bpbs = [(h["step"], h["eval_val_bpb"]) for h in trainer.state.log_history if "eval_val_bpb" in h]
    return losses, bpbs


def plot_curves(trainer, path: Path) -> None:
    """PNG with the per-step train loss and the val bpb curve."""
    import matplotlib  # here, not at the top: start-up time of every run, and the backend is set before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses, bpbs = _history(trainer)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    if losses:
        ax1.plot(*zip(*losses), lw=1)
    ax1.set(title="train loss", xlabel="step", ylabel="nats/token")
    if bpbs:
        ax2.plot(*zip(*bpbs), marker="o")
    ax2.set(title="validation bits per byte", xlabel="step", ylabel="bpb")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_bytes(path, png.getvalue())


def write_report(trainer, output_dir: str | os.PathLike, metrics: dict) -> Path:
    """report.md + training_curves.png in output_dir; returns the report path."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(trainer, out / CURVES_FILE)
    a = trainer.args
    keys = [
        "model_source",
        "train_mixture",
        "val_mixture",
        "num_iterations",
        "max_seq_len",
        "device_batch_size",
        "total_batch_size",
        "gradient_accumulation_steps",
        "matrix_lr",
        "embedding_lr",
        "unembedding_lr",
        "init_lr_frac",
        "weight_decay",
        "eval_every",
        "eval_tokens",
        "dtype",
        "bf16",
        "seed",
    ]
    lines = ["# nanochat-hf mid-training report", "", "## Config", "", "| argument | value |", "|---|---|"]
    lines += [f"| {k} | {getattr(a, k)} |" for k in keys]
    lines += [f"| world_size | {trainer.accelerator.num_processes} |", f"| device | {a.device} |"]
    lines += ["", "## Final metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    lines += ["", f"![training curves]({CURVES_FILE})", ""]
    path = out / REPORT_FILE
    write_text(path, "\n".join(lines))
    if trainer.chat_eval_scores:
        write_report_section(path, trainer.chat_eval_scores)
    return path


def _hub_datasets(mixture: str | None) -> list[str]:
    """Hub dataset ids the train mixture reads (none for local files and synthetic tasks)."""
    _, specs, _ = read_mixture(mixture, split="train")
    ids = []
    for spec in specs:
        task = MIXTURE_TASKS[spec.task]
        if task.kind != "hub" or spec.data_files:
            continue
        name = spec.path or task.dataset
        if not os.path.exists(name) and name not in ids:
            ids.append(name)
    return ids


def _card_data(a, scores: list, name: str) -> ModelCardData:
    source = a.model_source
    # a base model on the hub is named by its repo id; a local directory or nanochat checkpoint has none to link
    hub_base = source if source and source.count("/") == 1 and not os.path.exists(source) else None
    return ModelCardData(
        base_model=hub_base,
        datasets=_hub_datasets(a.train_mixture) or None,
        license="mit",
        language=["en"],
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["nanochat", "mid-training", "custom_code"],
        eval_results=model_index_results(scores) or None,
        model_name=name if scores else None,
    )


def write_model_card(trainer, output_dir: str | os.PathLike) -> Path:
    """README.md with the hub metadata (huggingface_hub's ModelCardData) and a loading snippet that runs as is."""
    a = trainer.args
    steps = trainer.state.global_step
    tokens = steps * a.total_batch_size
    base = (
        a.model_source
        if a.model_source not in (None, "", "demo")
        else f"none: a fresh demo model (depth {a.demo_depth}, "
        f"width {NanoChatGPTConfig.from_depth(a.demo_depth).n_embd}) trained from scratch"
    )
    mixture = a.train_mixture or "the embedded offline demo mixture"
    bpb = trainer.min_val_bpb
    bpb_last = next((h["eval_val_bpb"] for h in reversed(trainer.state.log_history) if "eval_val_bpb" in h), None)
    repo = a.hub_model_id or str(Path(output_dir).resolve())
    scores = trainer.chat_eval_scores
    chat_eval = f"\n## Chat evaluation\n\n{results_table(scores)}\n" if scores else ""
    body = f"""
# {Path(repo).name}

nanochat's GPT, mid-trained with nanochat-hf (nanochat's mid-training recipe on the
Hugging Face stack: Muon + AdamW, `transformers.Trainer`, Accelerate).

- base model: {base}
- mixture: {mixture}
- steps: {steps}, tokens: {tokens:,} ({a.total_batch_size:,} per step, sequence length {a.max_seq_len})
- final validation bits per byte: {f"{bpb_last:.4f}" if bpb_last is not None else "n/a"} (minimum {bpb:.4f})

## How to load

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{repo}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{repo}", trust_remote_code=True)
messages = [{{"role": "user", "content": "Spell the word: apple"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
out = model.generate(**inputs, max_new_tokens=64, do_sample=False)
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```
{chat_eval}
(`trust_remote_code=True` on the tokenizer too: the tokenizer itself is plain, but `AutoTokenizer` reads the model's
config first, and that needs the model's code. After `import nanochat_hf` neither needs it.)
"""
    card = ModelCard(f"---\n{_card_data(a, scores, Path(repo).name).to_yaml()}\n---\n{body}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODEL_CARD_FILE
    write_text(path, str(card))
    return path
