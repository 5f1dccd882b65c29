"""Optimizer recipe 2026-07 (nanochat HEAD's MuonAdamW): equal to nanochat's own step, 2 processes equal 1."""

import pytest
import torch

from nanochat_hf.errors import UserError
from nanochat_hf.optim import MuonAdamW, NorMuonAdamW, build_optimizer


def _assert_close_to(params, expected, initial, what):
    """Within 1e-5 of the largest 5-step change of each parameter: float32 rounding (nanochat computes a few
    scalar hyperparameter expressions, e.g. AdamW's bias corrections, in float32 where we use float64)."""
    for n, p in params.items():
        change = (expected[n] - initial[n]).abs().max().item()
        diff = (p.detach() - expected[n]).abs().max().item()
        assert diff <= 1e-5 * change + 1e-9, f"{what}: {n} differs by {diff:.3g} (5-step change {change:.3g})"


def test_five_steps_equal_nanochat_head(helpers):
    """Same parameters, gradients and schedule as nanochat's own MuonAdamW (tests/optim/data/README.md): same
    groups, rates, parameters after 5 steps and optimizer state, index by index (nanochat's file layout)."""
    initial, grads, final, ref_state = helpers.head_reference()
    model = helpers.named_module(initial, n_embd=32)
    opt = build_optimizer(model, **helpers.HEAD_RATES, recipe="2026-07")
    assert isinstance(opt, NorMuonAdamW) and not opt.reduces_gradients
    assert [g["name"] for g in opt.param_groups] == [
        "adamw/lm_head",
        "adamw/wte",
        "adamw/value_embeds",
        "adamw/resid_lambdas",
        "adamw/x0_lambdas",
        "adamw/smear",
        "muon/1x12",
        "muon/16x32",
        "muon/32x32",
        "muon/32x128",
        "muon/128x32",
    ]
    s = (32 / 768) ** -0.5
    assert [g["lr"] for g in opt.param_groups[:6]] == pytest.approx([0.004 * s, 0.3 * s, 0.15 * s, 0.005, 0.5, 0.2])
    assert [g["betas"] for g in opt.param_groups[:6]] == [
        (0.8, 0.96),
        (0.8, 0.995),
        (0.8, 0.995),
        (0.8, 0.95),
        (0.96, 0.95),
        (0.8, 0.95),
    ]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.001, 0.01, 0.05, 0.0, 0.0] + [0.2] * 5
    helpers.head_steps(model, opt, grads)
    _assert_close_to(dict(model.named_parameters()), final, initial, "ours vs nanochat")
    state = opt.state_dict()["state"]
    assert {f"{i}/{k}" for i, st in state.items() for k, v in st.items() if torch.is_tensor(v)} == set(ref_state)
    for key, expected in ref_state.items():
        i, name = key.split("/")
        ours = state[int(i)][name]
        scale = expected.abs().max().item()
        assert ours.shape == expected.shape and (ours - expected).abs().max().item() <= 1e-5 * scale, key
    assert all(st["step"] == 5 for st in state.values() if "step" in st)


def test_g0_model_recipe_switch(helpers):
    """A G0 model takes either recipe; the default stays the December optimizer; an unknown recipe is one line."""
    model = helpers.tiny_model()
    assert type(build_optimizer(model)) is MuonAdamW
    opt = build_optimizer(model, recipe="2026-07")
    shapes = sorted({tuple(p.shape) for n, p in model.named_parameters() if n.startswith("transformer.h.")})
    assert [g["name"] for g in opt.param_groups] == ["adamw/lm_head", "adamw/wte"] + [
        f"muon/{r}x{c}" for r, c in shapes
    ]
    before = helpers.flat_params(model)
    ids = helpers.batches(1, 1)[0][0]
    helpers.loss_backward(model, ids)
    opt.step()
    assert torch.isfinite(helpers.flat_params(model)).all() and not torch.equal(before, helpers.flat_params(model))
    with pytest.raises(
        UserError, match=r"^optimizer setting recipe='2026-01' \(str\): expected one of '2025-12', '2026-07'$"
    ):
        build_optimizer(model, recipe="2026-01")


def test_scalar_parameter_with_unknown_name_is_refused():
    model = torch.nn.Module()
    model.config = type("C", (), {"n_embd": 32})()
    model.mystery = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="parameter 'mystery' belongs to no optimizer group of recipe 2026-07"):
        build_optimizer(model, recipe="2026-07")


def test_clipping_in_the_step(helpers):
    """max_grad_norm clips the global norm of the gradient inside the step, at every world size the same way."""
    initial, grads, _, _ = helpers.head_reference()
    clipped, scaled = helpers.named_module(initial, 32), helpers.named_module(initial, 32)
    opt = build_optimizer(clipped, **helpers.HEAD_RATES, recipe="2026-07")
    opt.max_grad_norm = 5.0
    ref = build_optimizer(scaled, **helpers.HEAD_RATES, recipe="2026-07")
    norm = torch.cat([g.flatten() for g in grads[0].values()]).norm().item()
    helpers.head_steps(clipped, opt, grads[:1])
    helpers.head_steps(scaled, ref, [{n: g * (5.0 / (norm + 1e-6)) for n, g in grads[0].items()}])
    assert opt.last_grad_norm == pytest.approx(norm, rel=1e-5)
    for (n, p), q in zip(clipped.named_parameters(), scaled.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-7), n


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("max_grad_norm", [0.0, 5.0])
def test_two_gloo_processes_equal_one(helpers, gloo_runs, max_grad_norm):
    """2 processes: parameters the same on both ranks and equal to one process (so to nanochat's, without
    clipping), the consolidated state equal to one process's, each rank holding the state the layout rule says."""
    tmp_path = gloo_runs / f"head{max_grad_norm}"  # head_dist_worker's, in conftest's shared spawn
    result = torch.load(tmp_path / "result.pt", weights_only=True)
    assert result["same_on_every_rank"]
    initial, grads, final, _ = helpers.head_reference()
    single = helpers.named_module(initial, 32)
    opt = build_optimizer(single, **helpers.HEAD_RATES, recipe="2026-07")
    opt.max_grad_norm = max_grad_norm
    helpers.head_steps(single, opt, grads)
    expected = {n: p.detach() for n, p in single.named_parameters()}
    _assert_close_to(result["params"], expected, initial, "2 processes vs 1")
    if not max_grad_norm:
        _assert_close_to(result["params"], final, initial, "2 processes vs nanochat")
    else:
        assert result["grad_norm"] == pytest.approx(opt.last_grad_norm, rel=1e-5)
    single_state = opt.state_dict()["state"]
    assert result["state"].keys() == single_state.keys()
    for i, st in result["state"].items():
        for key, v in st.items():
            ref = single_state[i][key]
            assert v == ref if key == "step" else torch.allclose(v, ref, rtol=1e-5, atol=1e-7), (i, key)
    muon = [tuple(p.shape) for g in opt.param_groups if g["kind"] == "muon" for p in g["params"]]
    adamw = [tuple(p.shape) for g in opt.param_groups if g["kind"] == "adamw" for p in g["params"]]
    per_rank = [torch.load(tmp_path / f"bytes{r}.pt") for r in range(2)]
    head_state_bytes_per_rank = helpers.optim_step_benchmark().head_state_bytes_per_rank
    assert per_rank == head_state_bytes_per_rank(muon, adamw, 2)
    assert helpers.state_bytes(opt.state_dict()) == head_state_bytes_per_rank(muon, adamw, 1)[0]
    assert max(per_rank) < 0.6 * head_state_bytes_per_rank(muon, adamw, 1)[0]
