"""Host-to-device copies of micro-batches, the way nanochat's loader makes them on CUDA."""

from __future__ import annotations

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
