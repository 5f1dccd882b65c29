"""Host-to-device copies of micro-batches, the way nanochat's loader makes them on CUDA; the CPU thread count every
command uses (mid_train, chat, chat_eval, serve, the benchmarks' defaults); glibc's allocator kept from handing
freed memory back to the kernel while training on CPU."""

from __future__ import annotations

import ctypes
import os
import platform
import time

import torch

from ..errors import UserError


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


CPU_SAMPLE_S = 0.2  # how long cpu_threads watches the cores: 20 clock ticks per core, enough to see a busy one


def usable_cores() -> set[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def check_num_threads(requested: int | None, name: str) -> None:
    """UserError in one line for a thread count that is not 1 to the usable cores; `name` is how the command
    spells the setting (`--num_threads 0`, `num_threads=0`)."""
    cores = len(usable_cores())
    if requested is not None and not 1 <= requested <= cores:
        raise UserError(f"{name}: expected 1 to {cores} (the CPU cores this process may use)")


def proc_stat() -> str:
    """The kernel's CPU time counters (Linux; OSError elsewhere)."""
    with open("/proc/stat") as f:
        return f.read()


def idle_cores(before: str, after: str, cpus: set[int], own_seconds: float = 0.0, ticks_per_s: int = 100) -> float:
    """How many of `cpus` other processes left idle between two readings of /proc/stat: their idle and iowait
    ticks as a share of all their ticks (steal included: a core the hypervisor takes is not ours), times their
    number. `own_seconds` of this process's CPU time in between count as idle: our own work is not another job's."""
    spent = idle = 0
    for text, sign in ((before, -1), (after, 1)):
        for line in text.splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                spent += sign * sum(ticks)
                idle += sign * (ticks[3] + ticks[4])
    if spent <= 0:
        return float(len(cpus))
    return min(float(len(cpus)), len(cpus) * (idle + own_seconds * ticks_per_s) / spent)


def pick_threads(cores: int, idle: float, processes: int = 1) -> int:
    """The idle cores (rounded, no more than `cores`) divided among `processes`, at least 1. A thread without a
    core of its own spin-waits at every synchronisation: on 2 cores shared with other jobs, 2 threads made
    generation several times slower than 1 (`benchmarks/threads.py`)."""
    return max(1, min(cores, int(idle + 0.5)) // processes)


def cpu_threads(requested: int | None = None, processes: int = 1, flag: str = "--num_threads") -> tuple[int, str]:
    """torch's CPU thread count for one of `processes` processes, and why (naming the command's `flag`): `requested`,
    else the cores that are idle now (/proc/stat over CPU_SAMPLE_S while this process sleeps), divided among the
    processes. Now, not the load average: that is a damped mean of the last minutes, about 1 for a minute after any
    one-core command, and it made the demo run on 1 of 2 idle cores 1.6x slower (issue 40). Idle time over a
    sample, not the runnable count of /proc/loadavg: that is one instant, which a job's short pause or burst
    decides. Processes of the same launch that are busy during the sample count as other jobs. Without /proc/stat:
    the 1-minute load average."""
    if requested:
        return requested, f"{requested} CPU thread(s) ({flag} {requested})"
    cpus = usable_cores()
    try:
        before, own = proc_stat(), time.process_time()
        time.sleep(CPU_SAMPLE_S)
        after, own = proc_stat(), time.process_time() - own
        idle = idle_cores(before, after, cpus, own, os.sysconf("SC_CLK_TCK"))
        how = f"idle now (/proc/stat over {CPU_SAMPLE_S} s)"
    except OSError:  # no /proc (macOS)
        idle = len(cpus) - os.getloadavg()[0] if hasattr(os, "getloadavg") else len(cpus)
        how = "idle by the 1-minute load average (no /proc/stat here)"
    threads = pick_threads(len(cpus), idle, processes)
    shared = f", divided among {processes} processes" if processes > 1 else ""
    return threads, (
        f"{threads} CPU thread(s) ({len(cpus)} cores, {max(idle, 0):.1f} of them {how}{shared}; {flag} sets it)"
    )


def use_cpu_threads(requested: int | None, processes: int = 1, flag: str = "--num_threads") -> str:
    """Set torch's CPU threads (`cpu_threads`); the line saying how many and why."""
    threads, line = cpu_threads(requested, processes, flag)
    torch.set_num_threads(threads)
    return line


# glibc's mallopt parameters (malloc.h) and the environment settings a user may have chosen them with instead
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
MALLOC_ENV = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)


def reuse_freed_memory() -> bool:
    """Make glibc's malloc keep the memory torch frees for its next allocations (no mmap for large blocks, no trim
    of the heap's top below 2 GiB); whether it was set. Why: torch has no caching allocator on CPU, and glibc serves
    each block over its mmap threshold (at most 32 MiB; an 8 x 256 micro-batch's logits over a 4096-token vocabulary
    are 32 MiB) with fresh pages from the kernel and unmaps it on free, so every training step zero-filled them
    again: at that shape ~210,000 page faults a step and a fifth of the step in the kernel (benchmarks/throughput.py,
    docs/performance.md). The cost: the process keeps its peak heap (peak RSS +10-13% there). Not set where the C
    library is not glibc, or where the environment already tunes malloc (MALLOC_*_, GLIBC_TUNABLES): the user's
    choice stands."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or any(k in os.environ for k in MALLOC_ENV):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))  # an int: at most 2 GiB
