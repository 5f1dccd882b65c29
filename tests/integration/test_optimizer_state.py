"""The optimizer-state files are world-size free and exact: a checkpoint written by 2 gloo processes holds exactly
the state that collectives gather from the ranks (test-only `consolidated_state_dict`), and read by 1, 3 or 4
processes and written again it holds the same bits. Every case: Conv1D stacks and 3-D expert rows, both recipes.
A partial set, or files of another model, grouping or recipe: one line, nothing loaded, nothing changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nanochat_hf.errors import UserError
from nanochat_hf.integration.optimizer_state import (
    OPTIMIZER_FILE,
    full_state,
    load_optimizer_state,
    read_optimizer_checkpoint,
)
from nanochat_hf.optim import build_optimizer

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name, st in a.items():
        assert st.keys() == b[name].keys(), name
        for key, value in st.items():
            same = torch.equal(value, b[name][key]) if torch.is_tensor(value) else value == b[name][key]
            assert same, (name, key)


@pytest.fixture(scope="module")
def two_process_checkpoint(state_worker, tmp_path_factory):
    """w2: written by 2 processes; w4 and w3: w2 read and written again by 4 and by 3 (3 does not divide the rows:
    uneven shards). One spawn of 4 processes, the three process groups one after another."""
    root = str(tmp_path_factory.mktemp("state"))
    w2, w4, w3 = (f"{root}/w{world}" for world in (2, 4, 3))
    state_worker.helpers.spawn_jobs(
        (state_worker.worker, 2, "train", "", w2), (state_worker.worker, 4, "reload", w2, w4),
        (state_worker.worker, 3, "reload", w2, w3),
    )  # fmt: skip
    return Path(root)


def test_a_checkpoint_of_two_processes_is_the_gathered_state_and_reads_the_same_anywhere(
    state_worker, two_process_checkpoint
):
    root = two_process_checkpoint
    for arch, recipe in state_worker.CASES:
        case = f"{arch}-{recipe}"
        saved = read_optimizer_checkpoint(root / "w2" / case)
        assert (saved.world_size, saved.recipe) == (2, recipe)
        _assert_same(saved.whole_state(), torch.load(root / "w2" / case / "consolidated.pt", weights_only=True))
        model, opt = state_worker.build(arch, recipe, sharded=False)
        load_optimizer_state(opt, model, root / "w2" / case)  # one process
        _assert_same(full_state(opt, model), saved.whole_state())
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in saved.groups]  # settings too (step_fixed's)
        for world in (3, 4):
            again = read_optimizer_checkpoint(root / f"w{world}" / case)
            assert again.world_size == world
            _assert_same(again.whole_state(), saved.whole_state())


def test_bad_checkpoints_are_one_line_and_nothing_is_loaded(state_worker, two_process_checkpoint, tmp_path):
    source = two_process_checkpoint / "w2" / "qwen2_moe-2026-07"
    model, opt = state_worker.build("qwen2_moe", "2026-07", sharded=False)

    def refused(folder, expected):
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        with pytest.raises(UserError) as e:
            load_optimizer_state(opt, model, folder)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert not opt.state and {p.name: p.read_bytes() for p in folder.iterdir()} == before

    partial = tmp_path / "partial"
    shutil.copytree(source, partial)
    (partial / OPTIMIZER_FILE.format(rank=1)).unlink()
    refused(partial, f"{partial / OPTIMIZER_FILE.format(rank=1)}: missing: a partial checkpoint (2 processes wrote")
    mixed = tmp_path / "mixed"  # rank 1's file of another case
    shutil.copytree(source, mixed)
    other = two_process_checkpoint / "w2" / "gpt2-2026-07" / OPTIMIZER_FILE.format(rank=1)
    shutil.copy(other, mixed / OPTIMIZER_FILE.format(rank=1))
    refused(mixed, "optimizer.rank1.safetensors: written by another run than optimizer.rank0.safetensors")
    refused(two_process_checkpoint / "w2" / "gpt2-2026-07", "a checkpoint of another model or grouping: its param")
    refused(two_process_checkpoint / "w2" / "qwen2_moe-2025-12", "optimizer state of recipe 2025-12, this run's is")
    roles = {**state_worker.helpers.MOE_ROLES, "*.shared_expert.*": "scalar"}  # those matrices to AdamW too
    opt = build_optimizer(model, recipe="2026-07", roles=roles, polar_dtype="float32", sharded=False)
    refused(source, "a checkpoint of another model or grouping")
