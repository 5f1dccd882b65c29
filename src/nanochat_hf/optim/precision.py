"""The dtype Muon orthogonalises in (``polar_dtype``): bfloat16 where the hardware multiplies it natively, else float32.

nanochat's December code runs Newton-Schulz in bfloat16 on every device; HEAD runs Polar Express in its compute
dtype (bfloat16 on CUDA from SM 8.0, float32 elsewhere). On a CPU without native bfloat16 arithmetic (AVX2 only, or
oneDNN off) torch emulates bfloat16 matrix products, measured 40-70x slower than float32, so "auto" keeps nanochat's
choice only where it costs nothing: the one owner of that decision is :func:`resolve_polar_dtype`.
"""

from __future__ import annotations

import functools
import time

import torch

from ..errors import UserError

POLAR_DTYPES = ("auto", "bfloat16", "float32")
# bfloat16 counts as native on a CPU when a bfloat16 matrix product takes at most this many times the float32 one
# (one thread: native 0.1-0.3x on avx512_bf16; emulated 40-70x on 2-core x86-64 machines)
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
    """bfloat16 / float32 time of a 256 x 256 product on one thread of this CPU (cached per oneDNN setting; about
    50 ms where bfloat16 is emulated, 2 ms where native).

    One thread: torch emulates bfloat16 products on one thread whatever the thread count, and a float32 product on
    several threads of busy cores can wait ~50x its time for a descheduled thread, which made emulation look
    native."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _product_seconds(torch.bfloat16) / _product_seconds(torch.float32)
    finally:
        torch.set_num_threads(threads)


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
    in optimizer ``recipe`` ("2025-12" or "2026-07"), and why in a few words ("pinned" when not auto), for the run's
    first lines.

    auto: bfloat16 on CUDA devices of SM 8.0 or newer (nanochat HEAD's test) and, for the December recipe, on CPUs
    that multiply bfloat16 natively and on other devices that run it (MPS); float32 elsewhere, and for recipe 2026-07
    on every non-CUDA device (nanochat HEAD's compute dtype there). A pinned bfloat16 is checked to run at all.
    """
    if isinstance(setting, torch.dtype):
        setting = polar_dtype_name(setting)
    if setting not in POLAR_DTYPES:
        raise UserError(f"polar_dtype={setting!r}: expected one of {', '.join(POLAR_DTYPES)}")
    device = torch.device(device)
    if setting != "auto":
        if setting == "bfloat16":
            _check_runs_bfloat16(device)
        return getattr(torch, setting), "pinned"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) >= (8, 0):
            return torch.bfloat16, f"CUDA SM {major}{minor} multiplies bfloat16 natively"
        return torch.float32, f"CUDA SM {major}{minor} (before Ampere) has no native bfloat16"
    if recipe != "2025-12":
        return torch.float32, f"nanochat HEAD orthogonalises in its compute dtype, float32 on {device.type}"
    if device.type == "cpu":
        native, measured = cpu_has_native_bfloat16()
        if native:
            return torch.bfloat16, f"{measured}: native, so nanochat's December dtype"
        return torch.float32, f"{measured}: emulated, so float32"
    try:
        _check_runs_bfloat16(device)
    except UserError:
        return torch.float32, f"{device.type} cannot multiply bfloat16 matrices"
    return torch.bfloat16, f"nanochat's December dtype, which {device.type} runs"


def polar_dtype_name(dtype: torch.dtype) -> str:
    """A param group stores the dtype by name ("bfloat16"), so that the optimizer state stays JSON-able."""
    return str(dtype).removeprefix("torch.")
