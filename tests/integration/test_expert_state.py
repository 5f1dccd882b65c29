"""MoE expert stacks in Muon keep their optimizer state through a checkpoint: each stack's momentum (and, in recipe
2026-07, NorMuon's second moment) is written by name and read back bit for bit, in both recipes. (The 2-process
reshard tests route experts to AdamW; this is the Muon route, whose state is per stack, not per group.)"""

import pytest
import torch

from nanochat_hf.integration.optimizer_state import OPTIMIZER_FILE, load_optimizer_state, save_optimizer_state
from nanochat_hf.optim import build_optimizer


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_expert_stacks_state_round_trips(state_worker, tmp_path, recipe):
    model = state_worker.helpers.tiny_hf("mixtral")
    opt = build_optimizer(model, recipe=recipe, polar_dtype="float32")
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 9), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    save_optimizer_state(opt, model, tmp_path / OPTIMIZER_FILE.format(rank=0))
    again = build_optimizer(model, recipe=recipe, polar_dtype="float32")
    load_optimizer_state(again, model, tmp_path)
    names = {id(p): n for n, p in model.named_parameters()}
    stacks = [p for p in model.parameters() if p.ndim == 3]
    assert stacks and all(p in opt.state for p in stacks)
    for p, st in opt.state.items():
        for key, value in st.items():
            if torch.is_tensor(value):
                assert torch.equal(again.state[p][key], value), (names[id(p)], key)
