"""Trainer callbacks: Muon momentum warm-up and nanochat's per-step log line."""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

# bf16 dense peak per device, for MFU (nanochat uses the H100 number)
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "4090": 165e12}


def muon_momentum(step: int) -> float:
    """Linear warm-up 0.85 -> 0.95 over the first 300 optimizer steps (spec section 5)."""
    frac = min(step / 300, 1.0)
    return (1 - frac) * 0.85 + frac * 0.95


def lr_multiplier(step: int, num_steps: int) -> float:
    """nanochat's LR multiplier at progress step/num_steps: 1 until 0.8, then linear to 0 at 1.0 (reference)."""
    progress = step / num_steps
    return 1.0 if progress < 0.8 else 1.0 - (progress - 0.8) / 0.2


def device_peak_flops(device: torch.device, override: float | None = None) -> float | None:
    if override:
        return override
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return None  # CPU/MPS: MFU is "n/a" unless --peak_flops is given


class MuonMomentumCallback(TrainerCallback):
    """Sets Muon's momentum before each optimizer step from the global step (so resume restores it too)."""

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        opt = getattr(optimizer, "optimizer", optimizer)  # unwrap Accelerate's AcceleratedOptimizer
        if opt is not None and hasattr(opt, "set_muon_momentum"):
            opt.set_muon_momentum(muon_momentum(state.global_step))


class NanoChatLogger(TrainerCallback):
    """Times each optimizer step and turns the Trainer's per-step logs into nanochat's metrics.

    `MidTrainer.log` calls `enrich(logs)` before the logs reach any reporter (tensorboard, wandb, ...), so the
    nanochat metrics (ema loss, lrm, dt, tok/s, mfu) are reported like any other; `line(logs)` formats the
    console line. Its state (EMA, total time) is saved in checkpoints so a resumed run logs the same numbers.
    """

    def __init__(self, tokens_per_step: int, flops_per_token: int, peak_flops: float | None, world_size: int):
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak = peak_flops * world_size if peak_flops else None
        self.ema = 0.0
        self.total_time = 0.0
        self.dt = 0.0
        self._t0 = 0.0

    def state_dict(self) -> dict:
        return {"ema": self.ema, "total_time": self.total_time}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.total_time = state["ema"], state["total_time"]

    @staticmethod
    def _sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.dt = time.perf_counter() - self._t0
        if state.global_step > 10:  # nanochat leaves the first 10 steps (warm-up, compilation) out
            self.total_time += self.dt

    def enrich(self, logs: dict, step: int, max_steps: int) -> None:
        """Add nanochat's metrics to a training log of optimizer step `step` (1-based)."""
        beta = 0.9
        self.ema = beta * self.ema + (1 - beta) * logs["loss"]
        logs["ema_loss"] = self.ema / (1 - beta**step)
        logs["lrm"] = lr_multiplier(step - 1, max_steps)
        logs["progress"] = 100.0 * step / max_steps
        logs["dt_ms"] = self.dt * 1000
        tok_per_sec = self.tokens_per_step / self.dt if self.dt > 0 else 0.0
        logs["tok_per_sec"] = tok_per_sec
        if self.peak:
            logs["mfu"] = 100.0 * self.flops_per_token * tok_per_sec / self.peak
        logs["total_time_min"] = self.total_time / 60

    @staticmethod
    def line(logs: dict, step: int, max_steps: int) -> str:
        mfu = f"{logs['mfu']:.2f}" if "mfu" in logs else "n/a"
        return (
            f"step {step:05d}/{max_steps:05d} ({logs['progress']:.2f}%) | loss: {logs['ema_loss']:.6f} | "
            f"lrm: {logs['lrm']:.2f} | dt: {logs['dt_ms']:.2f}ms | tok/sec: {logs['tok_per_sec']:,.0f} | "
            f"mfu: {mfu} | total time: {logs['total_time_min']:.2f}m"
        )


def format_log(logs: dict, state) -> str | None:
    """nanochat's console line for a training-step log or an evaluation log (None for other logs)."""
    if "ema_loss" in logs:
        return NanoChatLogger.line(logs, state.global_step, state.max_steps)
    if "eval_val_bpb" in logs:
        return (f"step {state.global_step:05d} | validation bpb: {logs['eval_val_bpb']:.4f} "
                f"(min {logs['eval_min_val_bpb']:.4f})")
    return None


class NanoChatProgressCallback(ProgressCallback):
    """The Trainer's progress bar, printing nanochat's lines instead of the raw log dicts."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = format_log(logs or {}, state)
        if state.is_world_process_zero and self.training_bar is not None and line:
            self.training_bar.write(line)


class NanoChatPrinterCallback(TrainerCallback):
    """Replaces the Trainer's PrinterCallback (--disable_tqdm): nanochat's lines on rank 0."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = format_log(logs or {}, state)
        if state.is_world_process_zero and line:
            print(line, flush=True)
