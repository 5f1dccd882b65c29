"""nanochat's model generations G1 to G5 (docs: the config's docstring) against logits computed once by nanochat's own
``GPT.forward`` at each generation's commit, stored in data/generations (see the README there: commit, script, seed).

Each file holds a tiny model's weights under nanochat's keys (bf16-exact values), input ids and nanochat's float32
logits for sequences shorter than, as long as and longer than the short attention window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

DATA = Path(__file__).parent / "data" / "generations"
TINY = {"vocab_size": 50, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "pad_vocab_size_to": 64}
SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]  # nanochat's "SSSL" over 3 layers
G1 = dict(TINY, sequence_len=64, residual_lambdas=True)
G2 = dict(G1, layer_types=SLIDING, sliding_window=33)  # nanochat: short window sequence_len // 2 = 32 (+ itself)
G3 = dict(G2, value_embeddings=True, ve_gate_channels=32, ve_gate_scale=2.0)
# G4: short window ceil(256 / 3 / 128) * 128 = 128; nanochat computes its rotary tables in the compute dtype from
# 1076f97 on, float32 in the reference run (bfloat16 before, as for G1 to G3): our "compute"
G4 = dict(
    G3,
    sequence_len=256,
    sliding_window=129,
    ve_gate_channels=12,
    ve_gate_scale=3.0,
    qk_scale=1.15,
    rope_theta=100000.0,
    rotary_dtype="compute",
)
G5 = dict(G4, qk_scale=1.2, smear=True, backout=True)  # short window ceil(256 / 4 / 128) * 128 = 128
GENERATIONS = {"g1": G1, "g2": G2, "g3": G3, "g4": G4, "g5": G5}
G0 = dict(TINY, sequence_len=64, pad_vocab_size_to=1)  # the December model, for the tests without a reference file


def from_nanochat_key(key: str) -> str:
    """nanochat's GPT keeps its scalars, smear gate and value embeddings at the top; ours sit in the backbone."""
    return key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"


def load_reference(gen: str) -> tuple[NanoChatGPTForCausalLM, dict, dict]:
    with safe_open(DATA / f"{gen}.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        meta = f.metadata()
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**GENERATIONS[gen])).eval()
    state = {
        from_nanochat_key(k.removeprefix("weight.")): v.float() for k, v in tensors.items() if k.startswith("weight.")
    }
    model.load_state_dict(state, strict=True)
    cases = {
        int(k.split(".")[1]): (tensors[k], tensors[f"logits.{k.split('.')[1]}"])
        for k in tensors
        if k.startswith("ids.")
    }
    return model, cases, meta


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("gen", list(GENERATIONS))
def test_logits_equal_nanochat_at_each_generation(gen, attn):
    model, cases, meta = load_reference(gen)
    model.set_attn_implementation(attn)
    windows = json.loads(meta["window_sizes"])
    if windows is not None:  # nanochat's per-layer FlashAttention windows (w, 0): w + 1 keys
        c = model.config
        assert [w + 1 for w, _ in windows] == [
            c.sliding_window if t == "sliding_attention" else c.sequence_len + 1 for t in c.layer_types
        ]
        assert min(cases) < c.sliding_window == sorted(cases)[1] < max(cases)  # shorter, equal, longer
    with torch.no_grad():
        for length, (ids, expected) in cases.items():
            logits = model(ids).logits
            assert logits.shape == expected.shape == (1, length, 50)
            assert (logits - expected).abs().max().item() < 1e-5, (gen, attn, length)


def test_each_generation_feature_changes_the_logits():
    """The references would catch a feature left out: switching it off moves the logits far beyond 1e-5."""
    model, cases, _ = load_reference("g5")
    ids, expected = cases[max(cases)]
    changes = [
        ("smear", False),
        ("backout", False),
        ("qk_scale", 1.0),
        ("layer_types", ["full_attention"] * 3),
        ("rope_theta", 10000.0),
        ("ve_gate_scale", 2.0),
    ]
    for field, value in changes:
        config = NanoChatGPTConfig(**{**G5, field: value})
        other = NanoChatGPTForCausalLM(config).eval()
        other.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            assert (other(ids).logits - expected).abs().max().item() > 1e-3, field


def random_generation_model(gen: str, seed: int = 0, **overrides) -> NanoChatGPTForCausalLM:
    """A generation's tiny model with random weights everywhere (smear_lambda and backout_lambda non-zero)."""
    fields = {"g0": G0, **GENERATIONS}[gen]
    config = NanoChatGPTConfig(**{**fields, "eos_token_id": 49, "pad_token_id": 48, **overrides})
    model = NanoChatGPTForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name or "lambda" in name else 0.3))
    return model


@pytest.mark.parametrize("gen", list(GENERATIONS))
def test_cached_generate_equals_the_full_forward(gen):
    """Greedy generate() with the KV cache: the logits of every step equal the full forward on the final sequence,
    past the sliding window (smear reads the previous token at each one-token step)."""
    model = random_generation_model(gen)
    window = model.config.sliding_window or 32
    prompt = torch.randint(0, 48, (2, window - 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        assert out.sequences.shape[1] > window + 8
        full = model(out.sequences).logits[:, prompt.shape[1] - 1 : -1]
        uncached = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, use_cache=False)
    assert (torch.stack(out.logits, dim=1) - full).abs().max().item() < 1e-5
    assert torch.equal(uncached, out.sequences)


@pytest.mark.parametrize("gen", ["g0", *GENERATIONS])
def test_generate_from_inputs_embeds_gives_the_tokens_of_input_ids(gen):
    """generate(inputs_embeds=...) decodes the tokens generate(input_ids=...) does, batched and left-padded. From G3
    on the value embeddings are looked up by token, so the ids come with the embeddings
    (generate(input_ids=..., inputs_embeds=...)); embeddings alone get one line saying so."""
    model = random_generation_model(gen)
    ids = torch.tensor([[47, 5, 17, 42, 7, 3, 9], [48, 48, 47, 4, 8, 15, 16]])  # row 1: two pads (48) on the left
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    embed = model.get_input_embeddings()
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        expected = model.generate(ids, **kw)
        with_ids = model.generate(input_ids=ids, inputs_embeds=embed(ids), **kw)
        other_embeds = model.generate(input_ids=ids, inputs_embeds=embed((ids + 1) % 47), **kw)
        if model.config.value_embeddings:
            with pytest.raises(ValueError, match=r"value embeddings \(nanochat G3 on\) are looked up by token"):
                model.generate(inputs_embeds=embed(ids), **kw)
        else:
            assert torch.equal(model.generate(inputs_embeds=embed(ids), **kw), expected[:, ids.shape[1] :])
    assert torch.equal(with_ids, expected)
    assert not torch.equal(other_embeds, expected)  # the embeddings are what the model reads


def test_g5_assisted_decoding_equals_greedy():
    """Assisted decoding (a smaller G5 drafts, the model verifies several tokens at once with its cache): smear's
    previous token is found at every verification step, so the tokens are plain greedy decoding's."""
    model = random_generation_model("g5")
    assistant = random_generation_model("g5", seed=3, n_layer=1, layer_types=["full_attention"])
    prompt = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None)
        assisted = model.generate(
            prompt, assistant_model=assistant, max_new_tokens=20, do_sample=False, eos_token_id=None
        )
    assert torch.equal(assisted, plain)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_g5_one_token_steps_need_and_use_the_previous_token(attn):
    model = random_generation_model("g5")
    model.set_attn_implementation(attn)
    ids = torch.randint(0, 48, (2, 140), generator=torch.Generator().manual_seed(2))  # past the 129-key window
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :130], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(130, 140):
            out = model(ids[:, t : t + 1], cache=cache, previous_input_ids=ids[:, t - 1], use_cache=True)
            steps.append(out.logits)
        assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5
        with pytest.raises(ValueError, match="previous_input_ids"):
            model(ids[:, 140:141], cache=cache, use_cache=True)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("gen", ["g2", "g5"])
def test_batched_left_padded_equals_one_by_one(gen, cache_implementation):
    model = random_generation_model(gen)
    prompts = [list(range(1, 40)), [5, 6], list(range(10, 30))]  # g2's window is 33 keys
    kw = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None, "cache_implementation": cache_implementation}
    pad = model.config.pad_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        singles = [model.generate(torch.tensor([p]), **kw)[0, len(p) :].tolist() for p in prompts]
        batched = model.generate(input_ids=ids, attention_mask=mask, **kw)[:, width:].tolist()
        padded = model(ids, attention_mask=mask).logits[1, -2:]  # a padded row's logits at its real tokens
        alone = model(torch.tensor([prompts[1]])).logits[0]
    assert batched == singles
    assert (padded - alone).abs().max().item() < 1e-5


def test_beam_search_reorders_the_smear_input():
    model = random_generation_model("g5")
    prompt = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 8, "do_sample": False, "num_beams": 3, "eos_token_id": None}
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **kw), model.generate(prompt, use_cache=False, **kw))


def test_g5_from_scratch_follows_nanochat_init_weights():
    """nanochat's GPT.init_weights at a825e63/HEAD, for the values it fixes (zeros, constants, ranges)."""
    torch.manual_seed(0)
    config = NanoChatGPTConfig(
        **{
            **G5,
            "vocab_size": 512,
            "n_layer": 4,
            "n_embd": 128,
            "n_head": 2,
            "n_kv_head": 1,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        }
    )
    sd = NanoChatGPTForCausalLM(config).state_dict()
    s = 3**0.5 * 128**-0.5
    assert torch.equal(sd["transformer.resid_lambdas"], torch.tensor([1.15, 1.15 - 0.1 / 3, 1.15 - 0.2 / 3, 1.05]))
    assert torch.equal(sd["transformer.x0_lambdas"], torch.tensor([0.20, 0.15, 0.10, 0.05]))
    assert sd["transformer.smear_lambda"].tolist() == [0.0]
    assert sd["transformer.backout_lambda"] == torch.tensor([0.2])
    for i in range(4):
        h = f"transformer.h.{i}."
        assert (sd[h + "attn.c_proj.weight"] == 0).all() and (sd[h + "mlp.c_proj.weight"] == 0).all()
        for name, bound in (("attn.c_q", s), ("attn.c_k", s), ("attn.c_v", s), ("mlp.c_fc", 0.4 * s)):
            w = sd[h + name + ".weight"]
            assert (
                w.abs().max() <= bound and w.abs().max() > 0.95 * bound and abs(w.std() - bound / 3**0.5) < 0.1 * bound
            )
    gates = [sd["transformer.smear_gate.weight"]] + [sd[f"transformer.h.{i}.attn.ve_gate.weight"] for i in (1, 3)]
    assert all(g.min() >= 0 and g.max() <= 0.02 and g.max() > 0 for g in gates)
    assert sorted(k for k in sd if "value_embeds" in k) == [
        "transformer.value_embeds.1.weight",
        "transformer.value_embeds.3.weight",
    ]
    for i in (1, 3):
        ve = sd[f"transformer.value_embeds.{i}.weight"]
        assert ve.shape == (512, 64) and ve.abs().max() <= s and ve.abs().max() > 0.95 * s
    assert abs(sd["transformer.wte.weight"].std() - 0.8) < 0.02
    assert abs(sd["lm_head.weight"].std() - 0.001) < 0.0001


def test_g5_saves_and_loads_with_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM

    model = random_generation_model("g5")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.smear and loaded.config.layer_types == SLIDING
    for k, v in model.state_dict().items():  # nothing re-initialised on load
        assert torch.equal(loaded.state_dict()[k], v), k


@pytest.mark.slow
def test_g5_chat_pipeline_and_calculator_tool():
    from transformers import pipeline

    from nanochat_hf.inference import generate_tokens
    from nanochat_hf.tokenizer import render_for_completion, train_tokenizer

    tokenizer = train_tokenizer(["The answer is 5. Let me compute 2+3 with the calculator."] * 10, vocab_size=300)
    model = random_generation_model(
        "g5",
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    messages = [{"role": "user", "content": "hello"}]
    reply = pipeline("text-generation", model=model, tokenizer=tokenizer)(messages, max_new_tokens=6, do_sample=False)
    prompt = render_for_completion(tokenizer, {"messages": messages})
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt) :]
    assert reply[0]["generated_text"][-1]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
    # a prompt ending in a calculator call: the tool's answer is forced in, in a left-padded batch as alone
    call = (
        tokenizer.convert_tokens_to_ids(["<|python_start|>"])
        + tokenizer.encode("2+3", add_special_tokens=False)
        + tokenizer.convert_tokens_to_ids(["<|python_end|>"])
    )
    prompts = [prompt + call, prompt[:3] + call]
    batched = generate_tokens(model, tokenizer, prompts, max_new_tokens=6)
    assert batched == [generate_tokens(model, tokenizer, [p], max_new_tokens=6)[0] for p in prompts]
    forced = (
        tokenizer.convert_tokens_to_ids(["<|output_start|>"])
        + tokenizer.encode("5", add_special_tokens=False)
        + tokenizer.convert_tokens_to_ids(["<|output_end|>"])
    )
    assert all(row[: len(forced)] == forced for row in batched)


def test_g5_flops_per_token_equal_nanochat_estimate_flops():
    """nanochat's GPT.estimate_flops at HEAD 92d63d4 for this tiny G5 config (window_pattern "SSSL"): 412,080 at
    sequence_len 256 (short window 128) and 1,395,120 at 2048 (short window 512), printed by nanochat's code.
    (a825e63 counted 6 x 24 fewer: it left the smear gate's weights out of the matmul parameters.)"""
    for seq, window, expected in ((256, 129, 412_080), (2048, 513, 1_395_120)):
        config = NanoChatGPTConfig(**{**G5, "sequence_len": seq, "sliding_window": window})
        with torch.device("meta"):
            assert NanoChatGPTForCausalLM(config).num_flops_per_token() == expected


def test_g5_gradient_checkpointing_gives_the_same_gradients():
    ids = torch.randint(0, 48, (2, 150), generator=torch.Generator().manual_seed(5))
    grads = []
    for checkpointing in (False, True):
        model = random_generation_model("g5").train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0]["transformer.value_embeds.0.weight"].abs().sum() > 0
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6), name


def test_config_refuses_gates_wider_than_the_model():
    with pytest.raises(ValueError, match="ve_gate_channels must be between 1 and n_embd \\(16\\), got 32"):
        NanoChatGPTConfig(n_embd=16, n_head=2, value_embeddings=True)
    with pytest.raises(ValueError, match="smear reads the first 24 channels"):
        NanoChatGPTConfig(n_embd=16, n_head=2, smear=True)
    with pytest.raises(ValueError, match="value embeddings .* pass input_ids"):
        random_generation_model("g3")(inputs_embeds=torch.zeros(1, 3, 32))
