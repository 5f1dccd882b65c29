"""``split_fused=True``: the blocks of a fused projection (q, k, v; gate, up) are orthogonalised as matrices of their
own, in both recipes, for the fused layouts of Phi3, GPT-NeoX (q, k, v interleaved per head), Falcon (per KV group),
GPT-2 (Conv1D, stored (in, out)) and a MoE's fused experts (Mixtral). The reference steps the same groups with each
block as a separate 2-D parameter, the blocks cut by the layouts below, written from each model's forward in
transformers 5.24 (not from our code). Off by default."""

import pytest
import torch
from torch import nn

from nanochat_hf.errors import UserError
from nanochat_hf.optim import build_optimizer

H, KV, HD, WIDTH = 4, 2, 8, 32  # the tiny models: 4 heads of 8, 2 KV heads, width 32


def _rows(w, *sizes):
    return list(w.split(sizes))


# name suffix -> the blocks of the weight as the model uses it, (out, in); from each model's attention / MLP forward
LAYOUTS = {
    # Phi3Attention: qkv[..., :H*hd] queries, then KV*hd keys, then KV*hd values
    "phi3 qkv_proj.weight": lambda w: _rows(w, H * HD, KV * HD, KV * HD),
    # GPTNeoXAttention: view(..., -1, 3 * head_size) per head, then chunk(3): q, k, v interleaved per head
    "gpt_neox query_key_value.weight": lambda w: [b.reshape(-1, WIDTH) for b in w.view(H, 3, HD, WIDTH).unbind(1)],
    # FalconAttention (new_decoder_architecture): per KV group its H/KV query heads, then one key, one value
    "falcon query_key_value.weight": lambda w: [
        w.view(KV, H // KV + 2, HD, WIDTH)[:, : H // KV].reshape(-1, WIDTH),
        w.view(KV, H // KV + 2, HD, WIDTH)[:, -2].reshape(-1, WIDTH),
        w.view(KV, H // KV + 2, HD, WIDTH)[:, -1].reshape(-1, WIDTH),
    ],
    # GPT2Attention: c_attn(x).split(n_embd, dim=2), Conv1D stored (in, out): the (out, in) matrix is its transpose
    "gpt2 c_attn.weight": lambda w: _rows(w.T, WIDTH, WIDTH, WIDTH),
    # Phi3MLP: gate_up_proj(x).chunk(2, dim=-1); MixtralExperts: linear(x, gate_up_proj[e]).chunk(2, dim=-1)
    "phi3 gate_up_proj.weight": lambda w: list(w.chunk(2)),
    "mixtral gate_up_proj": lambda w: list(w.chunk(2)),
}


def _layout(arch, name):
    return next((f for key, f in LAYOUTS.items() if key.split()[0] == arch and name.endswith(key.split()[1])), None)


def _matrices(arch, name, t):
    """The separate 2-D matrices the reference steps for parameter (or gradient) ``t``: its blocks (of each expert)."""
    layout = _layout(arch, name)
    experts = t.unbind(0) if t.ndim == 3 else [t]
    return [b for e in experts for b in layout(e)]


def _reference(opt, model, arch):
    """A fresh optimizer of opt's class: every split group as one group per block index, each block of each
    parameter (and expert) a separate 2-D parameter at the group's settings; the other groups on copies."""
    names = {id(p): n for n, p in model.named_parameters()}
    copies, groups = {}, []
    for group in opt.param_groups:
        if "split" not in group:
            params = []
            for p in group["params"]:
                copies[names[id(p)]] = [nn.Parameter(p.detach().clone())]
                params += copies[names[id(p)]]
            groups.append({**group, "params": params})
            continue
        settings = {k: v for k, v in group.items() if k not in ("params", "split", "transposed")}
        per_param = []
        for p in group["params"]:
            copies[names[id(p)]] = [nn.Parameter(m.clone()) for m in _matrices(arch, names[id(p)], p.detach())]
            per_param.append(copies[names[id(p)]])
        blocks = len(group["split"][1])
        for i in range(blocks):  # block i of every matrix: same shape (one stack in recipe 2026-07)
            groups.append(
                {**settings, "name": f"{group['name']}/{i}", "params": [m for ms in per_param for m in ms[i::blocks]]}
            )
    return type(opt)(groups, sharded=False), copies


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
@pytest.mark.parametrize("arch", ["phi3", "gpt_neox", "falcon", "gpt2", "mixtral"])
def test_each_block_steps_as_its_own_matrix(helpers, arch, recipe):
    model = helpers.tiny_hf(arch)
    assert not any("split" in g for g in build_optimizer(model, recipe=recipe).param_groups)  # off by default
    whole = helpers.tiny_hf(arch)
    opt = build_optimizer(model, recipe=recipe, split_fused=True, polar_dtype="float32")
    split_names = {name for r in opt.routing.routes if "/split" in r.group for name in r.names}
    assert split_names and all(_layout(arch, n) for n in split_names)
    ref, copies = _reference(opt, model, arch)
    grads = helpers.fixed_grads(model, 4, 0)
    helpers.step_fixed(model, opt, grads)
    helpers.step_fixed(whole, build_optimizer(whole, recipe=recipe, polar_dtype="float32"), grads)
    for i, step_grads in enumerate(grads):
        for name, parts in copies.items():
            pieces = _matrices(arch, name, step_grads[name]) if name in split_names else [step_grads[name]]
            for part, piece in zip(parts, pieces):
                part.grad = piece.clone()
        for group in ref.param_groups:
            group["lr"] = group["initial_lr"] * (1.0 - 0.1 * i)
        ref.step()
    params = dict(model.named_parameters())
    for name, parts in copies.items():
        ours = _matrices(arch, name, params[name].detach()) if name in split_names else [params[name].detach()]
        for mine, expected in zip(ours, parts):
            rel = ((mine - expected.detach()).norm() / expected.detach().norm()).item()
            assert rel < 1e-6, (name, rel)
    apart = dict(whole.named_parameters())
    assert all(not torch.allclose(params[n], apart[n], atol=1e-4) for n in split_names)  # splitting did something


def test_split_groups_resume_and_bad_config(helpers):
    """Recipe 2026-07 keeps a second moment per block; a fresh optimizer loading the state continues the same run.
    A config whose blocks do not tile the weight is refused in one line."""
    model, again = helpers.tiny_hf("phi3"), helpers.tiny_hf("phi3")
    opt = build_optimizer(model, recipe="2026-07", split_fused=True, polar_dtype="float32")
    group = next(g for g in opt.param_groups if g["name"] == "muon/64x32/split64:32+16+16")
    grads = helpers.fixed_grads(model, 4, 0)
    helpers.step_fixed(model, opt, grads[:2])
    assert {k: tuple(v.shape) for k, v in opt.state[group["params"][0]].items()} == {
        "momentum_buffer": (2, 64, 32),
        "second_momentum_buffer_0": (2, 32, 1),
        "second_momentum_buffer_1": (2, 1, 32),
        "second_momentum_buffer_2": (2, 1, 32),
    }
    resumed = build_optimizer(model, recipe="2026-07", split_fused=True, polar_dtype="float32")
    resumed.load_state_dict(opt.state_dict())
    helpers.step_fixed(model, resumed, grads[2:])
    straight = build_optimizer(again, recipe="2026-07", split_fused=True, polar_dtype="float32")
    helpers.step_fixed(again, straight, grads[:2])
    helpers.step_fixed(again, straight, grads[2:])
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6)
    model.config.num_key_value_heads = 3  # 4*8 + 2*3*8 = 80 rows, the weight has 64
    with pytest.raises(
        UserError, match=r"split_fused: model\.layers\.0\.self_attn\.qkv_proj\.weight has 64 output rows"
    ):
        build_optimizer(model, split_fused=True)
