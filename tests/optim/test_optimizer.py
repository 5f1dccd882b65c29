import copy

import pytest
import torch

from nanochat_hf.optim import MuonAdamW, build_optimizer


def test_groups_lrs_and_labels(helpers):
    model = helpers.tiny_model(n_layer=2)  # n_embd 64: AdamW rates scaled by (64/768)^-0.5 = sqrt(12)
    opt = build_optimizer(model, init_lr_frac=0.5, weight_decay=0.1)
    assert isinstance(opt, torch.optim.Optimizer) and not opt.reduces_gradients
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"muon/matrix", "adamw/lm_head", "adamw/wte"}
    scale = 12**0.5
    expected = {"muon/matrix": 0.02 * 0.5, "adamw/lm_head": 0.004 * scale * 0.5, "adamw/wte": 0.2 * scale * 0.5}
    for name, lr in expected.items():
        assert groups[name]["lr"] == pytest.approx(lr) and groups[name]["initial_lr"] == groups[name]["lr"]
    assert groups["adamw/wte"]["betas"] == (0.8, 0.95) and groups["adamw/wte"]["eps"] == 1e-10
    assert groups["adamw/wte"]["weight_decay"] == 0.1 and groups["muon/matrix"]["momentum"] == 0.95
    named = dict(model.named_parameters())
    assert groups["adamw/wte"]["params"] == [named["transformer.wte.weight"]]
    assert groups["adamw/lm_head"]["params"] == [named["lm_head.weight"]]
    block = [p for n, p in named.items() if n.startswith("transformer.h.")]
    assert len(groups["muon/matrix"]["params"]) == len(block) == 12
    opt.set_muon_momentum(0.87)
    assert groups["muon/matrix"]["momentum"] == 0.87


def test_stray_parameter_is_named(helpers):
    model = helpers.tiny_model(n_layer=1)
    model.extra_scale = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="extra_scale"):
        build_optimizer(model)


def test_lr_scheduler_scales_every_group(helpers):
    model = helpers.tiny_model(n_layer=1)
    opt = build_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < 2 else 0.25)
    for _ in range(2):
        opt.step()  # no gradients yet: nothing moves, but the schedule advances
        sched.step()
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(0.25 * g["initial_lr"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_is_exact(helpers, dtype):
    """Save after two steps, reload into a fresh optimizer on restored weights: the third step is bit-identical,
    and bf16 parameters keep float32 optimizer state through the reload."""
    data = helpers.batches(3, 1)
    model = helpers.tiny_model(n_layer=1, dtype=dtype)
    opt = build_optimizer(model)
    for step in range(2):
        helpers.loss_backward(model, data[step][0])
        opt.step()
        opt.zero_grad()
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    helpers.loss_backward(model, data[2][0])
    opt.step()
    expected = helpers.flat_params(model)

    model.load_state_dict(saved_model)
    model.zero_grad(set_to_none=True)
    fresh = build_optimizer(model, init_lr_frac=0.3)  # lrs come back from the state dict
    fresh.load_state_dict(saved_opt)
    assert [g["lr"] for g in fresh.param_groups] == [g["lr"] for g in opt.param_groups]
    assert all(v.dtype == torch.float32 for st in fresh.state.values() for v in st.values() if torch.is_tensor(v))
    helpers.loss_backward(model, data[2][0])
    fresh.step()
    assert torch.equal(helpers.flat_params(model), expected)


def test_load_rejects_mismatched_state(helpers):
    opt = build_optimizer(helpers.tiny_model(n_layer=1))
    other = build_optimizer(helpers.tiny_model(n_layer=2))
    with pytest.raises(ValueError, match="muon/matrix"):
        opt.load_state_dict(other.state_dict())
    sharded = copy.deepcopy(opt.state_dict())
    sharded["sharding"] = {"world_size": 2, "rank": 1}
    with pytest.raises(ValueError, match="rank 1 of 2.*resume with the number of processes"):
        opt.load_state_dict(sharded)
    del sharded["sharding"]  # a plain torch optimizer's state_dict
    with pytest.raises(ValueError, match="no 'sharding' entry: it was not written by MuonAdamW.state_dict"):
        opt.load_state_dict(sharded)


def test_group_validation():
    with pytest.raises(ValueError, match="Muon needs 2-D"):
        MuonAdamW(
            [
                {
                    "params": [torch.nn.Parameter(torch.zeros(3))],
                    "kind": "muon",
                    "name": "m",
                    "lr": 0.1,
                    "initial_lr": 0.1,
                    "momentum": 0.9,
                    "nesterov": True,
                    "ns_steps": 5,
                }
            ]
        )
    with pytest.raises(ValueError, match="missing"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(3))], "kind": "adamw", "name": "a", "lr": 0.1}])


def test_matrix_optimizer_adamw_is_torch_adamw_on_every_parameter(helpers):
    """The AdamW-only ablation: the block matrices go to an "adamw/matrix" group at matrix_lr (not width-scaled),
    and three steps move every parameter exactly as torch's AdamW with nanochat's betas/eps and each group's rate."""
    model = helpers.tiny_model(n_layer=1)
    ref = copy.deepcopy(model)
    opt = build_optimizer(model, matrix_lr=0.003, matrix_optimizer="adamw")
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"adamw/matrix", "adamw/lm_head", "adamw/wte"}
    assert groups["adamw/matrix"]["lr"] == groups["adamw/matrix"]["initial_lr"] == 0.003
    named = dict(ref.named_parameters())
    by_name = {
        n: groups[g]["lr"]
        for g, names in (("adamw/wte", ["transformer.wte.weight"]), ("adamw/lm_head", ["lm_head.weight"]))
        for n in names
    }
    ref_opt = torch.optim.AdamW(
        [{"params": [p], "lr": by_name.get(n, 0.003)} for n, p in named.items()],
        betas=(0.8, 0.95),
        eps=1e-10,
        weight_decay=0.0,
    )
    for ids in [b[0] for b in helpers.batches(3, 1)]:
        for m, o in ((model, opt), (ref, ref_opt)):
            helpers.loss_backward(m, ids)
            o.step()
            o.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_matrix_optimizer_unknown_value_is_named(helpers):
    with pytest.raises(ValueError, match="matrix_optimizer='sgd'"):
        build_optimizer(helpers.tiny_model(n_layer=1), matrix_optimizer="sgd")
