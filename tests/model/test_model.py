"""Our model against nanochat's math (docs/nanochat.md), its init, loss conventions, cache, padding and generation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.model.modeling_nanochat_gpt import CACHE, rotary_cos_sin

F32_EPS = torch.finfo(torch.float32).eps


def reference_logits(sd: dict, cfg: dict, idx: torch.Tensor, rotary_dtype: torch.dtype) -> torch.Tensor:
    """Spec section 1 written out by hand: norm after embedding, RoPE (rotation by -theta on halves, tables
    rounded to `rotary_dtype`) then QK-norm, causal GQA attention, squared ReLU MLP, soft-capped float32 logits."""
    B, T = idx.shape
    d, H, KV, L = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["n_layer"]
    hd = d // H

    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + F32_EPS)

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos().to(rotary_dtype)[None, :, None], angles.sin().to(rotary_dtype)[None, :, None]

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)

    x = norm(sd["transformer.wte.weight"][idx])
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        w = {k.split(f"h.{i}.", 1)[1]: v for k, v in sd.items() if f".h.{i}." in k}
        h = norm(x)
        q = rope((h @ w["attn.c_q.weight"].T).view(B, T, H, hd))
        k = rope((h @ w["attn.c_k.weight"].T).view(B, T, KV, hd))
        v = (h @ w["attn.c_v.weight"].T).view(B, T, KV, hd)
        q, k = norm(q).transpose(1, 2), norm(k).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.transpose(1, 2).repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + y @ w["attn.c_proj.weight"].T
        x = x + torch.relu(norm(x) @ w["mlp.c_fc.weight"].T).square() @ w["mlp.c_proj.weight"].T
    logits = (norm(x) @ sd["lm_head.weight"].T).float()
    return 15.0 * torch.tanh(logits / 15.0)


@pytest.mark.parametrize("rotary_dtype", ["bfloat16", "float32"])
def test_logits_equal_spec_math_with_gqa(make_model, rotary_dtype):
    model = make_model(rotary_dtype=rotary_dtype)
    cfg = model.config.to_nanochat_dict()
    assert cfg["n_kv_head"] < cfg["n_head"]
    idx = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(idx).logits
    ref = reference_logits(model.state_dict(), cfg, idx, getattr(torch, rotary_dtype))
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 1e-4
    # the switch matters: the other table precision gives visibly different logits
    other = reference_logits(
        model.state_dict(), cfg, idx, torch.float32 if rotary_dtype == "bfloat16" else torch.bfloat16
    )
    assert (ours - other).abs().max().item() > 1e-4


def test_compute_rotary_tables_follow_the_dtype_the_model_runs_in(make_model):
    """rotary_dtype "compute" (nanochat since 1076f97, G4/G5): float32 tables in a float32 forward, bfloat16 ones with
    bfloat16 weights or under bf16 autocast; the logits are those of the fixed-dtype model of that precision."""
    idx = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    models = {name: make_model(rotary_dtype=name) for name in ("compute", "float32", "bfloat16")}
    with torch.no_grad():
        logits = {name: m(idx).logits for name, m in models.items()}
        assert torch.equal(logits["compute"], logits["float32"])
        assert not torch.equal(logits["compute"], logits["bfloat16"])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = {name: m(idx).logits for name, m in models.items()}
        assert torch.equal(autocast["compute"], autocast["bfloat16"])
        bf16 = {name: m.to(torch.bfloat16)(idx).logits for name, m in models.items()}
        assert torch.equal(bf16["compute"], bf16["bfloat16"])


def test_bfloat16_rotary_tables_are_torch_rounding(make_model):
    """The bfloat16 tables hold exactly what ``.to(torch.bfloat16)`` of the float32 angles gives (the December model
    and nanochat up to 1076f97), however they are rounded inside (see test_compiled_logits_equal_eager)."""
    config = make_model(rotary_dtype="bfloat16").config
    positions = torch.arange(1 << 16)[None]
    cos, sin = rotary_cos_sin(config, positions)
    hd = config.head_dim
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = positions[0, :, None].float() * inv_freq
    assert cos.dtype == sin.dtype == torch.bfloat16
    assert torch.equal(cos[0, :, : hd // 2], angles.cos().to(torch.bfloat16))
    assert torch.equal(sin[0, :, : hd // 2], angles.sin().to(torch.bfloat16))


@pytest.mark.slow
def test_compiled_logits_equal_eager(make_model):
    """torch.compile (inductor, one graph) vs eager on a December model, whose rotary tables are bfloat16: within
    1e-4, the float32 kernels' own reordering (3e-6 measured), where the tables' rounding moves these logits by more
    than 1e-3 (float32 tables). A plain float32 -> bfloat16 cast is dropped by inductor inside a fused kernel (its
    ``emulate_precision_casts`` is off): the model rounds the tables by integer arithmetic so that compiled runs keep
    the rounding nanochat's bfloat16 buffers have (with the plain cast: 5.5e-3 here, the float32 tables' logits)."""
    model = make_model(sequence_len=256)
    exact = make_model(sequence_len=256, rotary_dtype="float32")
    ids = torch.randint(0, 300, (2, 200), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with torch.no_grad():
        eager, unrounded = model(ids).logits, exact(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    assert (unrounded - eager).abs().max().item() > 1e-3
    assert (compiled - eager).abs().max().item() < 1e-4


def test_loss_conventions(make_model):
    model = make_model()
    idx = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(2))
    labels = idx.clone()
    labels[0, :5] = -100
    out = model(idx, labels=labels)
    logits = out.logits[:, :-1]
    targets = labels[:, 1:]
    manual = F.cross_entropy(logits.reshape(-1, 300), targets.reshape(-1), ignore_index=-100, reduction="none")
    valid = targets.reshape(-1) != -100
    assert torch.allclose(out.loss, manual[valid].mean(), atol=1e-6)
    # per-token losses for bits-per-byte: (B, L-1), 0 where ignored
    per_token = model(idx, labels=labels, loss_reduction="none").loss
    assert per_token.shape == (2, 11)
    assert torch.allclose(per_token.reshape(-1), manual, atol=1e-6) and (per_token[0, :4] == 0).all()
    # gradient accumulation: sum / num_items_in_batch
    summed = model(idx, labels=labels, num_items_in_batch=100).loss
    assert torch.allclose(summed, manual[valid].sum() / 100, atol=1e-6)


def test_fresh_model_has_nanochat_init():
    torch.manual_seed(0)
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(vocab_size=512, n_layer=2, n_head=2, n_kv_head=1, n_embd=128))
    sd = model.state_dict()
    for key in ("lm_head.weight", "transformer.h.0.attn.c_proj.weight", "transformer.h.1.mlp.c_proj.weight"):
        assert (sd[key] == 0).all(), key
    assert abs(sd["transformer.wte.weight"].std().item() - 1.0) < 0.02
    expected = {
        "attn.c_q": 128**-0.5,
        "attn.c_k": 128**-0.5 * math.sqrt(64 / 128),
        "mlp.c_fc": 128**-0.5,
    }  # 1/sqrt(fan_in) * min(1, sqrt(fan_out/fan_in))
    for name, std in expected.items():
        got = sd[f"transformer.h.0.{name}.weight"].std().item()
        assert abs(got - std) / std < 0.05, (name, got, std)


def test_nanochat_names_load_strict_and_from_pretrained_keeps_weights(make_model, tmp_path):
    model = make_model()
    names = set(model.state_dict())
    assert "transformer.h.1.attn.c_q.weight" in names and "lm_head.weight" in names and len(names) == 2 + 2 * 6
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    other = NanoChatGPTForCausalLM(model.config)
    other.load_state_dict(plain, strict=True)
    model.save_pretrained(tmp_path)
    loaded = NanoChatGPTForCausalLM.from_pretrained(tmp_path)
    for k, v in loaded.state_dict().items():  # no re-init of loaded weights (zero-init layers included)
        assert torch.equal(v, plain[k]), k


def test_config_names_depth_and_flops():
    c = NanoChatGPTConfig(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256
    )
    assert (c.n_embd, c.n_layer, c.n_head, c.n_kv_head, c.sequence_len) == (128, 3, 4, 2, 256)
    assert c.hidden_size == 128 and c.max_position_embeddings == 256
    d20 = NanoChatGPTConfig.from_depth(20)
    assert d20.to_nanochat_dict() == {
        "sequence_len": 2048,
        "vocab_size": 65536,
        "n_layer": 20,
        "n_head": 10,
        "n_kv_head": 10,
        "n_embd": 1280,
    }
    assert (d20.final_logit_softcapping, d20.rope_theta, d20.rotary_dtype) == (15.0, 10000.0, "bfloat16")
    with torch.device("meta"):
        model = NanoChatGPTForCausalLM(d20)
    n_params = sum(p.numel() for p in model.parameters())
    assert 555e6 < n_params < 565e6  # the speedrun's ~561M
    assert model.num_flops_per_token() == 6 * (n_params - 65536 * 1280) + 12 * 20 * 10 * 128 * 2048
    with pytest.raises(ValueError, match="rotary_dtype"):
        NanoChatGPTConfig(rotary_dtype="float16")


def test_incremental_decoding_matches_full_forward(make_model):
    model = make_model()
    idx = torch.randint(0, 298, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx).logits
        out = model(idx[:, :6], use_cache=True)
        steps = [out.logits]
        cache = getattr(out, CACHE)  # past_key_values before transformers 5.24, cache since
        for t in range(6, 10):
            out = model(idx[:, t : t + 1], cache=cache, use_cache=True)
            cache = getattr(out, CACHE)
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_same_with_and_without_cache_past_sequence_len(make_model, attn):
    model = make_model()
    model.set_attn_implementation(attn)
    prompt = torch.tensor([[5, 17, 42, 99, 7]])
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)  # 45 tokens > sequence_len 32: tables grow
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kw)
        uncached = model.generate(prompt, use_cache=False, **kw)
    assert cached.shape == (1, 45)
    assert torch.equal(cached, uncached)


def test_sampling_options_run(make_model):
    model = make_model()
    torch.manual_seed(0)
    out = model.generate(
        torch.tensor([[5, 17, 42]]),
        max_new_tokens=6,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        eos_token_id=None,
    )
    assert out.shape == (1, 9) and int(out.max()) < 300


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_batched_left_padded_equals_one_by_one(make_model, attn):
    model = make_model()
    model.set_attn_implementation(attn)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        singles = [model.generate(torch.tensor([p]), **kw)[0, len(p) :].tolist() for p in prompts]
        width = max(map(len, prompts))
        pad = model.config.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        batched = model.generate(input_ids=ids, attention_mask=mask, **kw)[:, width:].tolist()
        # and the padded forward's logits at real tokens equal the unpadded ones
        logits = model(ids, attention_mask=mask).logits
        alone = model(torch.tensor([prompts[1]])).logits
    assert batched == singles
    assert (logits[1, -2:] - alone[0]).abs().max().item() < 1e-5


def test_eager_equals_sdpa(make_model):
    model = make_model()
    idx = torch.randint(0, 298, (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(idx)
    mask[0, :3] = 0
    with torch.no_grad():
        sdpa = model(idx, attention_mask=mask).logits
        model.set_attn_implementation("eager")
        eager = model(idx, attention_mask=mask).logits
    assert (sdpa[:, 3:] - eager[:, 3:]).abs().max().item() < 1e-5


def test_gradient_checkpointing_gives_same_gradients(make_model):
    idx = torch.randint(0, 298, (2, 8), generator=torch.Generator().manual_seed(5))
    grads = []
    for checkpointing in (False, True):
        model = make_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(idx, labels=idx).loss.backward()
        grads.append(model.transformer.h[0].attn.c_q.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
