"""NanoChatOptimizerMixin with a real transformers Trainer on an FSDP2-sharded model (fsdp_trainer_worker.py, run in
conftest's shared launches): 2 gloo processes train like one, clipping and gradient accumulation included, and FSDP1,
an FSDP2 sharding on dim 1 and HSDP (a 2-D mesh) are refused in one line when the Trainer is built (each fails if the
mixin stops calling its check)."""

import json
import re

import pytest
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_two_fsdp2_processes_train_like_one(one_process_runs, two_process_runs):
    """The same global batch of 4: 2 FSDP2 processes, each accumulating 2 micro-batches of 1 row (the first's
    reduce-scatter deferred: transformers 5.24's deferral crashed on a model the caller sharded), log the losses and
    clipped grad norms of one plain process, and end with its parameters (within 1e-5 relative per tensor: the
    batch's 4 rows are summed in one forward there, as (1 + 1) + (1 + 1) here, and Newton-Schulz amplifies the last
    bits)."""
    single, fsdp = one_process_runs / "single", two_process_runs / "fsdp"  # conftest's shared runs
    one = json.loads((single / "rank0.json").read_text())
    assert not one["fsdp"]
    ref = load_file(single / "params.safetensors")
    ours = load_file(fsdp / "params.safetensors")
    for rank in range(2):
        report = json.loads((fsdp / f"rank{rank}.json").read_text())
        assert report["fsdp"] and report["world_size"] == 2
        assert min(one["grad_norms"]) > 0.1  # every step clips
        for key in ("losses", "grad_norms"):
            assert report[key] == pytest.approx(one[key], rel=1e-6), key
    for name, p in ref.items():
        diff = ((ours[name] - p).norm() / p.norm()).item()
        assert diff <= 1e-5, f"{name}: {diff:.3g} relative"


@pytest.mark.parametrize(
    "mode, words",
    [
        ("fsdp1", "FSDP1 is not supported with nanochat's optimizer"),
        ("shard1", r"model.embed_tokens.weight: sharded as \(Shard\(dim=1\),\) on a 1-D mesh; nanochat's optimizer"),
        ("hsdp", r"model.embed_tokens.weight: sharded as \(Replicate\(\), Shard\(dim=0\)\) on a 2-D mesh; nanochat's"),
    ],
)
def test_fsdp1_and_other_shardings_refused_when_the_trainer_is_built(one_process_runs, mode, words):
    out = one_process_runs / mode  # conftest's shared runs
    said = (out / "refused.txt").read_text()
    assert re.match(words, said) and "\n" not in said, said
    assert not any((out / "run").rglob("*"))  # refused before anything was written (the Trainer made the folder)
    if mode == "shard1":  # the optimizer on its own, built on the shards or handed them later: the parameter named
        build, swap = ((out / f"refused_{how}.txt").read_text() for how in ("build", "swap"))
        assert re.match(words, build), build
        assert swap.startswith("lm_head.weight: sharded as (Shard(dim=1),) on a 1-D mesh"), swap  # (its group's first)
