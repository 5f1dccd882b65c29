"""`build_optimizer` on transformers models other than nanochat's: every parameter routed by its role (Llama, Qwen3,
Gemma, GPT-2, Qwen2-MoE, a PEFT LoRA model), the routing visible as data and as a table, bad input refused in one line,
and 2 gloo processes equal to 1."""

import pytest
import torch
from torch import nn

from nanochat_hf.errors import UserError
from nanochat_hf.optim import MuonAdamW, NorMuonAdamW, build_optimizer

S = (32 / 768) ** -0.5  # the width scale of the tiny models' AdamW rates


def _members(opt):
    return {route.group: set(route.names) for route in opt.routing.routes}


def _names(model, *fragments):
    return {n for n, _ in model.named_parameters() if any(f in n for f in fragments)}


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_llama_routing_by_role(helpers, recipe):
    model = helpers.tiny_hf("llama")
    opt = build_optimizer(model, recipe=recipe)
    assert type(opt) is (MuonAdamW if recipe == "2025-12" else NorMuonAdamW)
    members = _members(opt)
    assert members["adamw/lm_head"] == {"lm_head.weight"}
    assert members["adamw/embedding"] == {"model.embed_tokens.weight"}
    assert members["adamw/scalar"] == _names(model, "norm")
    muon = set().union(*(ns for g, ns in members.items() if g.startswith("muon/")))
    assert muon == _names(model, "_proj")
    if recipe == "2026-07":  # one group per shape, as nanochat HEAD stacks them
        assert {g for g in members if g.startswith("muon/")} == {"muon/32x32", "muon/16x32", "muon/64x32", "muon/32x64"}
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["adamw/lm_head"] == pytest.approx(0.004 * S) and lrs["adamw/embedding"] == pytest.approx(0.2 * S)
    assert lrs["adamw/scalar"] == pytest.approx(0.004 * S)
    assert all(g["lr"] == 0.02 and g["kind"] == "muon" for g in opt.param_groups if g["name"].startswith("muon/"))
    assert [r.group for r in opt.routing.routes] == [g["name"] for g in opt.param_groups]
    table = opt.routing.table()
    assert f"optimizer recipe {recipe} (roles routing)" in table and "adamw/embedding" in table
    assert opt.routing.group_of("model.norm.weight") == "adamw/scalar"


@pytest.mark.parametrize("arch", ["qwen3", "gemma"])
def test_qwen3_and_tied_gemma(helpers, arch):
    model = helpers.tiny_hf(arch)
    members = _members(build_optimizer(model))
    if arch == "gemma":  # tied head: once, as the embedding (a scaled embedding is an nn.Embedding too), head's rate
        assert "adamw/lm_head" not in members and "adamw/embedding" not in members
        assert members["adamw/tied_embedding"] == {"model.embed_tokens.weight"}
    else:
        assert members["adamw/lm_head"] == {"lm_head.weight"}
    assert members["adamw/scalar"] == _names(model, "norm")  # Qwen3's q_norm/k_norm included
    assert members["muon/matrix"] == _names(model, "_proj")


def test_gpt2_conv1d_orientation_and_tied_head(helpers):
    """GPT-2: wte and wpe are embeddings, the tied head is not routed twice, biases and LayerNorms are scalars; its
    Conv1D weights are stored (in, out), so each non-square one gets a rate carrying the orientation factor."""
    model = helpers.tiny_hf("gpt2")
    opt = build_optimizer(model)
    members = _members(opt)
    assert members["adamw/embedding"] == {"transformer.wpe.weight"}
    assert members["adamw/tied_embedding"] == {"transformer.wte.weight"} and "adamw/lm_head" not in members
    assert members["adamw/scalar"] == _names(model, "bias", "ln_")
    assert members["muon/matrix"] == _names(model, "attn.c_proj.weight")  # square: no factor
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["adamw/tied_embedding"] == pytest.approx(0.004 * S) and lrs["adamw/embedding"] == pytest.approx(0.2 * S)
    # real (out, in) shapes: c_attn (96, 32) -> sqrt(3); c_fc (128, 32) -> 2; mlp.c_proj (32, 128) -> 1, stored
    # (128, 32) where the step reads 2: factor 1/2
    assert lrs["muon/32x96/conv1d"] == pytest.approx(0.02 * 3**0.5)
    assert lrs["muon/32x128/conv1d"] == pytest.approx(0.02 * 2)
    assert lrs["muon/128x32/conv1d"] == pytest.approx(0.02 / 2)


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_conv1d_steps_as_the_equivalent_linear(recipe):
    """A Conv1D weight (in, out) moves as the transposed nn.Linear weight (out, in) it computes the same as, square
    or not, in both recipes: 2025-12 through the rate factor, 2026-07 (whose MuonEq, NorMuon and rate scale read the
    rows) by stepping the transposed views; also across a state_dict round trip into a fresh optimizer (resume)."""
    from transformers.pytorch_utils import Conv1D

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 32)
            self.layers = nn.ModuleList(
                [Conv1D(128, 32), nn.Linear(32, 128, bias=False), Conv1D(32, 32), nn.Linear(32, 32, bias=False)]
            )
            self.layers[0].bias.requires_grad_(False)
            self.layers[2].bias.requires_grad_(False)
            self.config = type("Cfg", (), {"hidden_size": 32})()

        def get_input_embeddings(self):
            return self.embed

    net = Net()
    pairs = [(net.layers[0], net.layers[1]), (net.layers[2], net.layers[3])]
    with torch.no_grad():
        for conv, linear in pairs:
            linear.weight.copy_(conv.weight.T)
    before = [linear.weight.detach().clone() for _, linear in pairs]
    opt = build_optimizer(net, recipe=recipe, polar_dtype="float32")
    transposed = {g["name"] for g in opt.param_groups if g.get("transposed")}
    assert transposed == ({"muon/32x128/conv1d", "muon/32x32/conv1d"} if recipe == "2026-07" else set())
    torch.manual_seed(0)
    for step in range(6):
        if step == 3:  # resume: a fresh optimizer loading the saved state continues the same run
            saved = opt.state_dict()
            opt = build_optimizer(net, recipe=recipe, polar_dtype="float32")
            opt.load_state_dict(saved)
        net.embed.weight.grad = torch.zeros(10, 32)
        for conv, linear in pairs:
            g = torch.randn(conv.weight.shape)
            conv.weight.grad, linear.weight.grad = g.clone(), g.T.clone()
        opt.step()
    for (conv, linear), w0 in zip(pairs, before):
        assert (linear.weight - w0).norm() > 0.01 * w0.norm()  # it did move
        rel = ((conv.weight.T - linear.weight).norm() / linear.weight.norm()).item()
        assert rel < 1e-6, rel


def test_peft_lora_adapters_in_adamw(helpers):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(helpers.tiny_hf("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    opt = build_optimizer(model)
    members = _members(opt)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert members == {"adamw/adapter": trainable}  # the base model frozen: the adapters only, all AdamW
    assert all("lora_" in n for n in trainable) and len(trainable) == 8


def test_peft_lora_with_trainable_matrices(helpers):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        helpers.tiny_hf("llama"), LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["down_proj"])
    )
    members = _members(build_optimizer(model))
    assert all("lora_" in n for n in members["adamw/adapter"]) and members["adamw/adapter"]
    assert members["muon/matrix"] and all("down_proj" in n for n in members["muon/matrix"])


def test_bad_models_refused_in_one_line(helpers):
    model = helpers.tiny_hf("llama")
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(UserError, match="every parameter of the model is frozen"):
        build_optimizer(model)
    model.model.embed_tokens.weight.requires_grad_(True)
    with pytest.raises(UserError, match="no trainable 2-D weight inside its repeated layers"):
        build_optimizer(model)
    model = helpers.tiny_hf("llama")
    model.projector = nn.Linear(32, 32)
    with pytest.raises(UserError, match=r"'projector.weight' \(32, 32\) fits no role"):
        build_optimizer(model)
    assert _members(build_optimizer(model, roles={"projector.*": "scalar"}))["adamw/scalar"] >= {"projector.weight"}
    with pytest.raises(UserError, match="'projector.weight' matches roles"):
        build_optimizer(model, roles={"projector.*": "scalar", "projector.w*": "matrix"})
    with pytest.raises(UserError, match="expected one of embedding, head, matrix, adapter, scalar"):
        build_optimizer(model, roles={"projector.*": "adam"})
    with pytest.raises(UserError, match="roles= and split_fused= route parameters of other models"):
        build_optimizer(helpers.tiny_model(n_layer=1), roles={"lm_head.weight": "scalar"})


def test_nanochat_model_keeps_its_layout(helpers):
    """nanochat's model: its own groups, by name, reported as such."""
    opt = build_optimizer(helpers.tiny_model(n_layer=1))
    assert opt.routing.layout == "nanochat"
    assert [r.group for r in opt.routing.routes] == ["adamw/lm_head", "adamw/wte", "muon/matrix"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_gloo_processes_equal_one_on_every_architecture(helpers, gloo_runs):
    """5 steps on fixed per-rank gradients, each architecture in both recipes, DDP-wrapped: the sharded step on 2
    processes equals 1 process stepping on the averaged gradient within 1e-6 (relative, per parameter); the MoE
    models' expert stacks are spread across the ranks, each rank holding its experts' state only; split_fused on
    Phi3, GPT-2 and Mixtral."""
    worst = torch.load(gloo_runs / "routing" / "worst.pt", weights_only=True)  # in conftest's shared spawn
    assert len(worst) == 2 * len(helpers.DIST_CASES)
    assert max(worst.values()) <= 1e-6, worst
