"""NanoChatOptimizerMixin under `accelerate launch` with 2 gloo processes: the gradients are averaged once, by the
optimizer (DDP left out: each gradient reduced onto its owner during backward, ZeRO-2), and training equals 1
process on the same global batch, and 2 machines of 1 process (launched on loopback) equal 2 processes; where a DDP
that manages every parameter cannot be silenced it averages, and the optimizer is told so (grads_averaged)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from mp_launch import _free_port, launch_command  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = str(Path(__file__).with_name("trainer_worker.py"))


def _run(tmp_path, name, nproc, *flags):
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [*launch_command(nproc, WORKER), str(out), *flags], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return reports, load_file(out / "params.safetensors"), proc.stdout


def _two_nodes(tmp_path):
    """Two `accelerate launch` "machines" of one process each, on loopback: the same 2 ranks as above."""
    out = tmp_path / "nodes"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    port = str(_free_port())
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--multi_gpu",
                "--num_processes",
                "2",
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                port,
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                WORKER,
                str(out),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    results = [node.communicate(timeout=600) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [err[-3000:] for _, err in results]
    return load_file(out / "params.safetensors")


def test_two_processes_average_once_and_equal_one(tmp_path):
    (single,), expected, _ = _run(tmp_path, "one", 1)
    reports, params, stdout = _run(tmp_path, "two", 2)
    assert all(r["world_size"] == 2 and not r["grads_averaged"] for r in reports)
    assert all(r["holders"] == [1, 1, 1, 1] for r in reports)  # ZeRO-2: only the owner keeps a matrix's gradient
    assert stdout.count("optimizer recipe 2025-12 (roles routing)") == 1  # the table, once (main process)
    worst = max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())
    print("worst relative parameter difference, 2 processes vs 1:", worst)
    assert worst < 1e-5
    assert reports[0]["losses"] == pytest.approx(single["losses"], rel=1e-5)

    # two machines of one process each (loopback) are the same two ranks: bit-identical to the 2-process run
    nodes = _two_nodes(tmp_path)
    assert all(torch.equal(nodes[n], p) for n, p in params.items())

    # a DDP that keeps its own communication hook averages the gradients; the optimizer knows they arrive averaged
    reports, params, stdout = _run(tmp_path, "hooked", 2, "--ddp_hook")
    assert all(r["grads_averaged"] and r["holders"] == [2] * 4 and all(r["same"]) for r in reports)
    assert "DDP averages the gradients" in stdout
    worst = max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())
    print("worst relative parameter difference, 2 processes (DDP averaging) vs 1:", worst)
    assert worst < 1e-5
