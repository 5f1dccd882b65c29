"""benchmarks/optim_step.py: its float32 torch.optim.Muon is torch's step with the orthogonalisation in float32, and
the table measures every recipe x dtype cell against torch.optim.Muon, predicting (not running) a cell that would
take too long, as a bfloat16 step does on a CPU that emulates bfloat16."""

from __future__ import annotations

import pytest
import torch

from .conftest import _load


@pytest.fixture(scope="module")
def optim_step():
    return _load("optim_step")


def test_torch_muon_in_float32_is_torchs_step_in_float32(optim_step):
    torch.manual_seed(0)
    start, grad = torch.randn(48, 96) * 0.02, torch.randn(48, 96)
    updates = {}
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        p = torch.nn.Parameter(start.clone())
        p.grad = grad.clone()
        opt = torch.optim.Muon([p], lr=0.02, weight_decay=0.0, adjust_lr_fn="original")
        with optim_step.torch_muon_in(dtype if dtype != torch.float64 else torch.float32):
            opt.step()
        updates[dtype] = p.detach() - start
    assert torch.equal(p.grad, grad)  # the float32 copy leaves the gradient alone
    # float32 rounds far less than torch's shipped bfloat16
    shipped = (updates[torch.bfloat16] - updates[torch.float64]).abs().max()
    assert 0 < shipped and torch.allclose(updates[torch.float32], updates[torch.float64])


def test_table_has_every_cell_and_predicts_slow_ones(optim_step, capsys):
    device = torch.device("cpu")
    optim_step.bench_table([1, 2], [torch.bfloat16, torch.float32], 1, budget=60.0, max_call=1e-9, device=device)
    out = capsys.readouterr().out
    rows = ("2025-12 (MuonAdamW)", "2026-07 (NorMuonAdamW)", "torch.optim.Muon")
    d1, d2 = ([line for line in t.splitlines() if line.startswith(rows)] for t in out.split("\nd2:"))
    for table in (d1, d2):
        assert [sum(line.startswith(row) for line in table) for row in rows] == [2, 2, 2], table
    assert all("median 1" in line for line in d1)
    assert all(" est. " in line for line in d2)  # predicted from d1 x the FLOP ratio, not run
