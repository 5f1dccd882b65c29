"""The dtype Muon orthogonalises in (``polar_dtype``): bfloat16 where the hardware multiplies it natively, else float32.

nanochat's December code runs Newton-Schulz in bfloat16 on every device; HEAD runs Polar Express in its compute
dtype (bfloat16 on CUDA, float32 elsewhere). On a CPU without native bfloat16 arithmetic (AVX2 only, or oneDNN off)
torch emulates bfloat16 matrix products, measured 40-70x slower than float32, so "auto" keeps nanochat's choice
only where it costs nothing: the one owner of that decision is :func:`resolve_polar_dtype`.
"""

from __future__ import annotations

import functools
import time

import torch

from ..errors import UserError

POLAR_DTYPES = ("auto", "bfloat16", "float32")
# bfloat16 counts as native on a CPU when a bfloat16 matrix product takes at most this many times the float32 one
# (native: 0.2-1x; emulated: 40-70x measured on 2-core x86-64 machines)
NATIVE_BF16_MAX_RATIO = 4.0


def _product_seconds(dtype: torch.dtype, n: int = 256, repeats: int = 3) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    a @ b  # warm-up: first-call dispatch and allocation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def _cpu_bf16_ratio(mkldnn_enabled: bool) -> float:
    """bfloat16 / float32 time of a 256 x 256 product on this CPU (cached per oneDNN setting; about 10 ms)."""
    return _product_seconds(torch.bfloat16) / _product_seconds(torch.float32)


def cpu_has_native_bfloat16() -> tuple[bool, str]:
    """Whether this CPU multiplies bfloat16 matrices at least about as fast as float32, and the measurement."""
    ratio = _cpu_bf16_ratio(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)
    return ratio <= NATIVE_BF16_MAX_RATIO, f"a bfloat16 matrix product takes {ratio:.1f}x the float32 one on this CPU"


def _check_runs_bfloat16(device: torch.device) -> None:
    """Refuse, in one line, bfloat16 on a device that cannot multiply bfloat16 matrices at all."""
    try:
        x = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        (x @ x).sum().item()
    except (RuntimeError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"polar_dtype=bfloat16: {device} cannot multiply bfloat16 matrices ({first}); use auto or float32"
        ) from None


def resolve_polar_dtype(setting: str | torch.dtype, device: torch.device, recipe: str) -> tuple[torch.dtype, str]:
    """The orthogonalisation dtype for ``setting`` ("auto", "bfloat16", "float32" or a torch dtype) on ``device``
    in optimizer ``recipe`` ("2025-12" or "2026-07"), and why, in words for the run's first lines.

    auto: bfloat16 on CUDA (when it supports bfloat16) and, for the December recipe, on MPS and on CPUs that
    multiply bfloat16 natively; float32 elsewhere, and for recipe 2026-07 on every non-CUDA device (nanochat HEAD's
    compute dtype there). A pinned bfloat16 is checked to run on the device at all.
    """
    if isinstance(setting, torch.dtype):
        setting = str(setting).removeprefix("torch.")
    if setting not in POLAR_DTYPES:
        raise UserError(f"polar_dtype={setting!r}: expected one of {', '.join(POLAR_DTYPES)}")
    device = torch.device(device)
    if setting != "auto":
        if setting == "bfloat16":
            _check_runs_bfloat16(device)
        return getattr(torch, setting), "pinned"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: CUDA multiplies bfloat16 natively"
        return torch.float32, "auto: this CUDA device has no native bfloat16"
    if recipe != "2025-12":
        return torch.float32, f"auto: nanochat HEAD orthogonalises in its compute dtype, float32 on {device.type}"
    if device.type == "cpu":
        native, measured = cpu_has_native_bfloat16()
        if native:
            return torch.bfloat16, f"auto: {measured}, nanochat's December dtype costs nothing"
        return torch.float32, f"auto: {measured} (emulated bfloat16), so float32"
    return torch.bfloat16, f"auto: nanochat's December dtype on {device.type}"


def polar_dtype_name(dtype: torch.dtype) -> str:
    """A param group stores the dtype by name ("bfloat16"), so that the optimizer state stays JSON-able."""
    return str(dtype).removeprefix("torch.")
