"""The RL run's report.md: the knobs, the reward curve and every pass@k evaluation, and the plot beside it."""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..atomic import write_bytes, write_text
from ..training.checkpoint.layout import CURVES_FILE, REPORT_FILE


def curves(log_history: list[dict]) -> tuple[list[tuple[int, float]], dict[int, dict[str, float]]]:
    """([(step, mean reward)], {step: {"pass@k": value}}) from the Trainer's log history (a resumed run's history
    continues the interrupted one's: it is restored from the checkpoint)."""
    rewards = [(h["step"], h["reward"]) for h in log_history if "reward" in h]
    passk = {h["step"]: {k: v for k, v in h.items() if k.startswith("pass@")} for h in log_history if "pass@1" in h}
    return rewards, passk


def plot(log_history: list[dict], path: Path) -> None:
    import matplotlib  # here: start-up time, and the backend is set before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards, passk = curves(log_history)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    if rewards:
        ax1.plot(*zip(*rewards), lw=1)
    ax1.set(title="mean reward per step", xlabel="step", ylabel="reward")
    for k in next(iter(passk.values()), {}):
        ax2.plot(list(passk), [p[k] for p in passk.values()], marker="o", label=k)
    ax2.set(title="GSM8K pass@k", xlabel="step", ylabel="fraction solved")
    if passk:
        ax2.legend(fontsize=7)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_bytes(path, png.getvalue())


def write_rl_report(trainer: Any, args: Any) -> Path:
    """report.md and training_curves.png in args.output_dir; returns the report's path."""
    out = Path(args.output_dir)
    history = trainer.state.log_history
    plot(history, out / CURVES_FILE)
    rewards, passk = curves(history)
    lines = ["# nanochat-hf RL report (chat_rl.py on TRL's GRPOTrainer)", "", "## Config", ""]
    lines += ["| argument | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in asdict(args).items())]
    lines += ["", f"## Reward ({len(rewards)} steps)", "", "| step | mean reward |", "|---|---|"]
    lines += [f"| {s} | {r:.4f} |" for s, r in rewards]
    if passk:
        ks = list(next(iter(passk.values())))
        lines += ["", "## pass@k", "", "| step | " + " | ".join(ks) + " |", "|---" * (len(ks) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{p[k]:.4f}" for k in ks) + " |" for s, p in passk.items()]
    lines += ["", f"![reward and pass@k]({CURVES_FILE})", ""]
    path = out / REPORT_FILE
    write_text(path, "\n".join(lines))
    return path
