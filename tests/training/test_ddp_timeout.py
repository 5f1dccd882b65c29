"""`ddp_timeout` reaches the gloo process group that TrainingArguments sets up with `use_cpu`, so a frozen rank makes
the others fail after ddp_timeout seconds instead of hanging for torch's 30-minute default.

Two real processes (env:// rendezvous, as torchrun sets it up) build the arguments and their process group: `slow`
and `multiprocess` (fresh processes are what is tested: each sets up its own process group, and one freezes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

REPO_ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import json, os, sys, time
from dataclasses import dataclass
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d
from transformers import TrainingArguments
from nanochat_hf.training.ddp_timeout import DDPTimeoutOnEveryBackendMixin

out, second_port = sys.argv[1], sys.argv[2]


def timeout_of_new_group(bases) -> float:
    args = dataclass(type("Args", bases, {}))(output_dir=out, use_cpu=True, ddp_timeout=3, report_to="none")
    args.device  # sets up Accelerate's state and the process group, as the Trainer does
    return distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds()


# The fault: plain TrainingArguments(use_cpu=True, ddp_timeout=3) leaves gloo at torch's 30-minute default.
result = {"plain_timeout_s": timeout_of_new_group((TrainingArguments,))}
dist.destroy_process_group()
os.environ["MASTER_PORT"] = second_port  # a fresh rendezvous: the first store may still be closing
result["fixed_timeout_s"] = timeout_of_new_group((DDPTimeoutOnEveryBackendMixin, TrainingArguments))
result["world_size"] = dist.get_world_size()
rank = dist.get_rank()
done, gave_up = os.path.join(out, "rank0_done"), os.path.join(out, "rank1_gave_up")
if rank == 1:  # the frozen peer: never joins the collective; leaves once rank 0 is done (or after 60 s)
    deadline = time.monotonic() + 60
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not os.path.exists(done):
        open(gave_up, "w").close()
    os._exit(0)
if rank == 0:
    try:
        dist.all_reduce(torch.ones(1))
        result["error"] = None
    except Exception as e:
        result["error"] = type(e).__name__
    result["peer_still_frozen"] = not os.path.exists(gave_up)  # rank 0 failed while rank 1 was still frozen
    open(done, "w").close()
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)  # no destroy_process_group: the peer is gone
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(out: Path) -> list[dict]:
    ports = [str(free_port()), str(free_port())]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT / "src"),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": ports[0],
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(out), ports[1]],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        results.append(json.loads(lines[0][len("RESULT ") :]) if lines else None)
    return results


def test_frozen_peer_fails_after_ddp_timeout_instead_of_hanging(tmp_path):
    rank0, rank1 = run_pair(tmp_path)
    assert rank1 is None  # the frozen peer left without reporting
    assert rank0["plain_timeout_s"] == 1800.0  # transformers alone: the fault
    assert rank0["world_size"] == 2 and rank0["fixed_timeout_s"] == 3.0
    assert rank0["error"] is not None and rank0["peer_still_frozen"]
