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
from mp_launch import _free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = str(Path(__file__).with_name("runs_worker.py"))


def _load(run, nproc):
    """A run of conftest's shared runs: each rank's report, rank 0's parameters, what each rank printed."""
    reports = [json.loads((run / f"rank{r}.json").read_text()) for r in range(nproc)]
    said = [(run / f"stdout.rank{r}.txt").read_text() for r in range(nproc)]
    return reports, load_file(run / "params.safetensors"), said


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
                '["nodes", "trainer"]',
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
    return load_file(out / "nodes" / "params.safetensors")


def test_two_processes_average_once_and_equal_one(one_process_runs, two_process_runs, tmp_path):
    """conftest's runs `one` and `two` (clip 1.0), then `hooked`; two machines here."""
    (single,), expected, _ = _load(one_process_runs / "one", 1)
    reports, params, said = _load(two_process_runs / "two", 2)
    assert all(r["world_size"] == 2 and not r["grads_averaged"] for r in reports)
    assert all(r["holders"] == [1, 1, 1, 1] for r in reports)  # ZeRO-2: only the owner keeps a matrix's gradient
    assert [s.count("optimizer recipe 2025-12 (roles routing)") for s in said] == [1, 0]  # the table, once (main)
    worst = max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())
    print("worst relative parameter difference, 2 processes vs 1:", worst)
    assert worst < 1e-5
    assert reports[0]["losses"] == pytest.approx(single["losses"], rel=1e-5)

    # two machines of one process each (loopback) are the same two ranks: bit-identical to the 2-process run
    nodes = _two_nodes(tmp_path)
    assert all(torch.equal(nodes[n], p) for n, p in params.items())

    # a DDP that keeps its own communication hook averages the gradients; the optimizer knows they arrive averaged
    reports, params, said = _load(two_process_runs / "hooked", 2)
    assert all(r["grads_averaged"] and r["holders"] == [2] * 4 and all(r["same"]) for r in reports)
    assert "DDP averages the gradients" in "".join(said)
    worst = max(((p - expected[n]).norm() / expected[n].norm()).item() for n, p in params.items())
    print("worst relative parameter difference, 2 processes (DDP averaging) vs 1:", worst)
    assert worst < 1e-5
