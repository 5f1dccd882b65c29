"""MoE expert stacks (transformers 5 stores experts as one 3-D parameter (E, out, in)) in nanochat's optimizer: every
expert is a Muon matrix of its own, in both recipes. The reference steps the same groups with each expert as a
separate 2-D parameter: the 2-D step is pinned to nanochat's own code by the parity tests (test_optimizer.py,
test_head_recipe.py), so an expert moving as its 2-D matrix moves as nanochat moves a matrix. The 2-process
sharded step on these models is compared with 1 process in test_routing.py (archs_dist_worker, MoE archs included)."""

import pytest
import torch
from torch import nn

from nanochat_hf.errors import UserError
from nanochat_hf.optim import MuonAdamW, NorMuonAdamW, build_optimizer


def _split_reference(opt, model):
    """A fresh optimizer of ``opt``'s class and groups (same settings) on copies of the parameters, each expert
    stack split into its experts as separate 2-D parameters; returns it and {name: [its parameters]}."""
    names = {id(p): n for n, p in model.named_parameters()}
    copies, groups = {}, []
    for group in opt.param_groups:
        params = []
        for p in group["params"]:
            parts = p.detach().unbind(0) if p.ndim == 3 and group["kind"] == "muon" else [p.detach()]
            copies[names[id(p)]] = [nn.Parameter(t.clone()) for t in parts]
            params += copies[names[id(p)]]
        groups.append({**group, "params": params})
    return type(opt)(groups, sharded=False), copies


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "olmoe"])
def test_each_expert_steps_as_its_own_matrix(helpers, arch, recipe):
    """Mixtral, Qwen2-MoE and OLMoE: 4 steps on fixed gradients; every expert of every stack ends where the
    per-expert reference puts it (and every other parameter where the reference puts it), within 1e-6."""
    model = helpers.tiny_hf(arch)
    opt = build_optimizer(model, recipe=recipe, polar_dtype="float32")
    stacks = {n for n, p in model.named_parameters() if p.ndim == 3}
    assert stacks and all(opt.routing.group_of(n).startswith("muon/") for n in stacks)
    assert all("experts" in opt.routing.group_of(n) for n in stacks)  # the table shows them as experts
    ref, copies = _split_reference(opt, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = helpers.fixed_grads(model, 4, 0)
    helpers.step_fixed(model, opt, grads)
    for i, step_grads in enumerate(grads):
        for name, parts in copies.items():
            g = step_grads[name]
            for part, piece in zip(parts, g.unbind(0) if len(parts) > 1 or g.ndim == 3 else [g]):
                part.grad = piece.clone()
        for group in ref.param_groups:
            group["lr"] = group["initial_lr"] * (1.0 - 0.1 * i)
        ref.step()
    for name, p in model.named_parameters():
        expected = torch.stack([q.detach() for q in copies[name]]) if name in stacks else copies[name][0].detach()
        rel = ((p.detach() - expected).norm() / expected.norm()).item()
        assert rel < 1e-6, (name, rel)
        if name in stacks:
            moved = (p.detach() - before[name]).flatten(1).norm(dim=1)
            assert (moved > 0.01 * before[name].flatten(1).norm(dim=1)).all(), name  # every expert moved


def test_expert_stacks_batched_and_state_per_stack(helpers):
    """Recipe 2026-07: one group per stack shape (a model's layers stepped as one stack of L*E matrices); each stack
    keeps its own state, one row per expert (the layout the optimizer-state files rely on)."""
    model = helpers.tiny_hf("mixtral")
    opt = build_optimizer(model, recipe="2026-07", polar_dtype="float32")
    helpers.step_fixed(model, opt, helpers.fixed_grads(model, 1, 0))
    gate_up = [p for n, p in model.named_parameters() if n.endswith("experts.gate_up_proj")]
    assert opt.routing.group_of("model.layers.0.mlp.experts.gate_up_proj") == "muon/3x128x32/experts"
    for p in gate_up:
        assert opt.state[p]["momentum_buffer"].shape == (3, 128, 32)
        assert opt.state[p]["second_momentum_buffer"].shape == (3, 128, 1)


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_transposed_experts_step_as_the_stored_out_in_stack(recipe):
    """An experts module storing (E, in, out) (``is_transposed``, as GPT-OSS) moves exactly as the (E, out, in)
    stack computing the same, square or not, in both recipes (as Conv1D weights do)."""

    class Experts(nn.Module):
        def __init__(self, shape, transposed):
            super().__init__()
            self.num_experts, self.is_transposed = shape[0], transposed
            self.w = nn.Parameter(0.02 * torch.randn(shape))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 32)
            shapes = [(3, 32, 64), (3, 32, 32)]  # stored (E, in, out)
            self.layers = nn.ModuleList(
                [Experts(s, True) for s in shapes] + [Experts((s[0], s[2], s[1]), False) for s in shapes]
            )
            self.config = type("Cfg", (), {"hidden_size": 32})()

        def get_input_embeddings(self):
            return self.embed

    torch.manual_seed(0)
    net = Net()
    pairs = [(net.layers[0].w, net.layers[2].w), (net.layers[1].w, net.layers[3].w)]
    with torch.no_grad():
        for stored, plain in pairs:
            plain.copy_(stored.mT)
    before = [plain.detach().clone() for _, plain in pairs]
    opt = build_optimizer(net, recipe=recipe, polar_dtype="float32")
    assert opt.routing.group_of("layers.0.w").startswith("muon/3x32x64/experts/transposed")
    for _ in range(4):
        net.embed.weight.grad = torch.zeros(10, 32)
        for stored, plain in pairs:
            g = torch.randn(stored.shape)
            stored.grad, plain.grad = g.clone(), g.mT.clone()
        opt.step()
    for (stored, plain), w0 in zip(pairs, before):
        assert (plain - w0).norm() > 0.01 * w0.norm()
        assert ((stored.mT - plain).norm() / plain.norm()).item() < 1e-6


def test_roles_override_and_non_expert_3d_refused(helpers):
    """roles= still routes expert stacks elsewhere (AdamW); a 3-D parameter that is no stack of experts (a conv
    kernel) is refused in one line naming it and the roles= fix."""
    model = helpers.tiny_hf("qwen2_moe")
    members = {r.group: set(r.names) for r in build_optimizer(model, roles=helpers.MOE_ROLES).routing.routes}
    experts = {n for n, _ in model.named_parameters() if ".experts." in n}
    assert experts <= members["adamw/scalar"] and "muon/experts" not in members
    assert type(build_optimizer(model)) is MuonAdamW and type(build_optimizer(model, recipe="2026-07")) is NorMuonAdamW
    model = helpers.tiny_hf("llama")
    model.model.layers[0].conv = nn.Conv1d(32, 32, 3)
    with pytest.raises(UserError) as e:
        build_optimizer(model)
    msg = str(e.value)
    assert "'model.layers.0.conv.weight' has shape (32, 32, 3)" in msg and "roles=" in msg and "\n" not in msg
    with pytest.raises(UserError, match="the role 'matrix' \\(Muon\\) takes 2-D weights and stacks of MoE experts"):
        build_optimizer(model, roles={"*.conv.weight": "matrix"})
