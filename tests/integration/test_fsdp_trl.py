"""TRL's SFTTrainer, DPOTrainer and GRPOTrainer with NanoChatOptimizerMixin on an FSDP2-sharded tiny Llama
(fsdp_trl_worker.py, run in conftest's shared launches: `fully_shard` per decoder layer and the root, 2 gloo
processes, CPU) train like one plain process: the same logged losses and clipped grad norms, the same parameters,
a whole saved model folder and whole checkpoints; the reference models of DPO and GRPO sharded as the policy is; an
SFT checkpoint of one process resumes on 2 FSDP2 processes (the stock resume fails on sharded parameters: the mixin
loads them)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def runs(one_process_runs, two_process_runs):
    """conftest's shared runs by name: single_<kind> and the continuous-batching refusal `cb` (one plain process),
    fsdp_<kind> and `resumed` (2 FSDP2 processes: single_sft's checkpoint at step 2 resumed)."""
    return {run.name: run for launch in (one_process_runs, two_process_runs) for run in launch.iterdir()}


def _report(out, rank=0):
    return json.loads((out / f"rank{rank}.json").read_text())


def _assert_same_training(single, fsdp):
    """2 FSDP2 processes log one process's losses and grad norms (to 1e-6 relative: each rank's loss is its half
    of the batch's, summed by the Trainer's gather) and end with its parameters within 1e-5 relative per tensor:
    one forward of 4 rows there, 2 + 2 here, so the gradients differ in the last bits, and Newton-Schulz amplifies
    them (the same bound as the plain Trainer's test, test_fsdp_trainer.py; measured here: at most 6.7e-6, GRPO's
    recipe 2026-07 on a Muon matrix)."""
    one = _report(single)
    assert not one["fsdp"]
    for rank in range(2):
        report = _report(fsdp, rank)
        assert report["fsdp"] and report["world_size"] == 2
        for key in ("losses", "grad_norms"):
            assert report[key] == pytest.approx(one[key], rel=1e-6), key
    ref = load_file(single / "params.safetensors")
    ours = load_file(fsdp / "params.safetensors")
    for name, p in ref.items():
        diff = ((ours[name] - p).norm() / p.norm()).item()
        assert diff <= 1e-5, f"{name}: {diff:.3g} relative"
    _assert_whole_folder(fsdp / "final", ours)


def _assert_whole_folder(folder, params, exact=True):
    """One ordinary Hugging Face folder (its weights in one model.safetensors, not per rank) that from_pretrained
    reads whole: exactly `params`, or (another run's) within 1e-5 relative per tensor."""
    assert [p.name for p in folder.glob("model*")] == ["model.safetensors"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    for name, p in model.named_parameters():
        if exact:
            assert torch.equal(p.detach(), params[name]), name
        else:
            assert ((p.detach() - params[name]).norm() / params[name].norm()).item() <= 1e-5, name


def test_sft_under_fsdp2_trains_saves_and_resumes_like_one_process(runs):
    single, fsdp = runs["single_sft"], runs["fsdp_sft"]
    _assert_same_training(single, fsdp)
    # the checkpoint at step 2: whole weights (those of one process's checkpoint), each rank's optimizer part
    ckpt = fsdp / "run" / "checkpoint-2"
    assert sorted(p.name for p in ckpt.glob("optimizer.*")) == [
        "optimizer.rank0.safetensors",
        "optimizer.rank1.safetensors",
    ]
    _assert_whole_folder(ckpt, load_file(single / "run" / "checkpoint-2" / "model.safetensors"), exact=False)
    # one process's checkpoint resumed by 2 FSDP2 processes: step 3 as in the uninterrupted run
    resumed = runs["resumed"]
    assert len(_report(resumed)["losses"]) == 3  # the checkpoint's 2 logged steps, then this run's one
    _assert_same_training(single, resumed)


def test_dpo_under_fsdp2_shards_the_reference_model_and_trains_like_one_process(runs):
    """The reference model, passed whole, is sharded as the policy is (the mixin's shard_like)."""
    single, fsdp = runs["single_dpo"], runs["fsdp_dpo"]
    _assert_same_training(single, fsdp)
    assert _report(fsdp)["ref_sharded"] and _report(fsdp, 1)["ref_sharded"]


def test_grpo_under_fsdp2_generates_and_trains_like_one_process(runs):
    """Generation from sharded parameters: completions of different lengths (some ranks stop before others, and
    generate keeps them stepping: transformers' synced_gpus), the same rewards as one process, the KL term of the
    reference model TRL builds (beta 0.1), sharded by the mixin and synced with the policy every step
    (sync_ref_model: a whole reference would fail there, mixing tensors with DTensors)."""
    single, fsdp = runs["single_grpo"], runs["fsdp_grpo"]
    _assert_same_training(single, fsdp)
    logs, one = _report(fsdp)["logs"], _report(single)["logs"]
    assert [h["reward"] for h in logs] == pytest.approx([h["reward"] for h in one], rel=1e-6)
    assert any(h["completions/min_length"] < h["completions/max_length"] for h in logs)
    assert any(h["loss"] != 0 for h in logs)
    assert _report(fsdp)["ref_sharded"] and _report(fsdp, 1)["ref_sharded"]


def test_grpo_continuous_batching_under_fsdp2_refused_when_the_trainer_is_built(runs):
    """transformers' continuous batching ignores synced_gpus: a rank done generating would stop calling forward
    while the others wait in FSDP2's all-gathers. One line, before anything is written (fails without the check)."""
    out = runs["cb"]
    said = (out / "refused.txt").read_text()
    assert said.startswith("use_transformers_continuous_batching=True is not supported with FSDP2: transformers'")
    assert "\n" not in said and not any((out / "run").rglob("*")), said
