"""Host-to-device copies of micro-batches, the way nanochat's loader makes them on CUDA; CPU thread count."""

from __future__ import annotations

import os

import torch


def pins_for(tensor: torch.Tensor, device: torch.device | str) -> bool:
    """Whether `tensor` goes to `device` through pinned memory: a CPU tensor bound for CUDA (pinning needs CUDA)."""
    return torch.device(device).type == "cuda" and tensor.device.type == "cpu"


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. A CPU tensor bound for CUDA is copied into pinned (page-locked) memory and sent with
    non_blocking=True, so the host goes on preparing the next micro-batch while the copy runs; the copy is ordered
    before any kernel that reads it on the current stream, and torch keeps the pinned block alive until the copy
    is done. Every other case is the plain `tensor.to(device)` (on CPU: the tensor itself)."""
    if pins_for(tensor, device):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def cpu_threads(requested: int | None = None, processes: int = 1) -> int:
    """torch's CPU thread count for one of `processes` processes: `requested`, else the cores this process may use
    divided among the processes, but no more than the cores other jobs leave idle (cores minus the 1-minute load
    average, at least 1). A thread without a core of its own spin-waits at every synchronisation: on 2 cores shared
    with other jobs, 2 threads made generation several times slower than 1 (`benchmarks/threads.py`)."""
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    idle = cores - os.getloadavg()[0] if hasattr(os, "getloadavg") else cores
    return max(1, min(cores // processes, int(idle + 0.5)))
