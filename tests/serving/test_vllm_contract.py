"""What vLLM's transformers backend requires of a custom model, checked by driving the model as that backend does
(vllm/model_executor/models/transformers/base.py and causal.py; vLLM itself cannot run on these machines).

The backend builds the backbone with ``AutoModel.from_config(config, trust_remote_code=True)`` after setting
``config._attn_implementation = "vllm"``, sizes its KV cache from the config (heads, kv heads, head size, layer
types and sliding window), and calls ``model(input_ids=(1, N), position_ids=(1, N), use_cache=False,
attention_instances=..., return_dict=False)`` with every scheduled sequence packed into one row. Its attention
function (registered in transformers' AttentionInterface) finds its own state through those kwargs, keeps the KV
cache itself and reads the layer's ``layer_idx``, ``scaling`` and ``sliding_window``. The LM head and the logit
soft cap (``final_logit_softcapping``) are the engine's. Here the engine's attention is emulated: a KV cache per
layer and sequence, plain softmax attention over it; the greedy tokens must be generate()'s, prompt by prompt."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from nanochat_hf import NanoChatGPTForCausalLM

PROMPTS = [[1, 17, 400, 23, 9, 3000, 77], [1, 5, 6], [1, 2048, 99, 4000, 12, 12, 12, 8, 31, 64, 3]]
STEPS = 14  # decoded tokens per prompt: past the G4 model's 9-key window


class EmulatedEngine:
    """vLLM's side: the KV cache of each (layer, sequence), the sequence of each packed token, its attention."""

    def __init__(self):
        self.kv: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.token_sequences: list[int] = []
        self.instances = object()  # vLLM's Attention layers, handed to the model as `attention_instances`
        self.kwargs_seen: set[str] = set()

    def attention(self, module, query, key, value, attention_mask, scaling=None, sliding_window=None, **kwargs):
        assert kwargs.get("attention_instances") is self.instances  # the engine's kwargs reach every layer
        assert attention_mask is None  # the model builds no mask of its own for an engine's attention
        self.kwargs_seen |= set(kwargs)
        outputs = []
        for i, sequence in enumerate(self.token_sequences):
            cached = self.kv.get((module.layer_idx, sequence))
            k, v = key[0, :, i : i + 1], value[0, :, i : i + 1]  # (kv heads, 1, head dim)
            if cached is not None:
                k, v = torch.cat([cached[0], k], dim=1), torch.cat([cached[1], v], dim=1)
            self.kv[(module.layer_idx, sequence)] = (k, v)
            window = module.sliding_window or k.shape[1]
            k, v = k[:, -window:], v[:, -window:]
            groups = module.num_key_value_groups
            k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
            weights = torch.softmax((query[0, :, i : i + 1] @ k.transpose(1, 2)) * scaling, dim=-1)
            outputs.append((weights @ v)[:, 0])  # (heads, head dim)
        return torch.stack(outputs)[None], None  # (1, N, heads, head dim), no weights


@pytest.fixture
def engine():
    engine = EmulatedEngine()
    AttentionInterface.register("vllm", engine.attention)
    yield engine
    del ALL_ATTENTION_FUNCTIONS._global_mapping["vllm"]


def engine_model(folder, engine):
    """The backbone as vLLM builds it (from the directory's remote code), with the saved weights; the LM head."""
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    assert config.auto_map["AutoModel"].endswith("NanoChatGPTModel")
    config._attn_implementation = "vllm"
    backbone = AutoModel.from_config(config, trust_remote_code=True).eval()
    assert type(backbone).__name__ == "NanoChatGPTModel" and backbone._supports_attention_backend
    full = NanoChatGPTForCausalLM.from_pretrained(folder).eval()
    backbone.load_state_dict(full.transformer.state_dict())
    # what vLLM reads from the config to size its KV cache and build its attention layers
    attention = [block.attn for block in backbone.h]
    assert config.num_hidden_layers == len(attention)
    assert {(a.n_head, a.n_kv_head, a.head_dim) for a in attention} == {
        (config.num_attention_heads, config.num_key_value_heads, config.hidden_size // config.num_attention_heads)
    }
    assert [a.sliding_window for a in attention] == [
        config.sliding_window if t == "sliding_attention" else None for t in config.layer_types
    ]
    return config, backbone, full


def engine_step(engine, config, backbone, full, tokens: list[int], positions: list[int], sequences: list[int]):
    """One scheduled batch, packed as vLLM packs it; returns each token's greedy next token."""
    engine.token_sequences = sequences
    with torch.no_grad():
        out = backbone(
            input_ids=torch.tensor([tokens]),
            position_ids=torch.tensor([positions]),
            use_cache=False,
            attention_instances=engine.instances,
            return_dict=False,
        )
        logits = full.lm_head(out[0][0])[:, : config.vocab_size].float()  # the engine's LM head
        cap = config.final_logit_softcapping  # the engine's soft cap (causal.py reads this name)
        return (cap * torch.tanh(logits / cap)).argmax(-1).tolist()


@pytest.mark.parametrize("generation", ["g0", "g4"])
def test_the_engine_s_greedy_tokens_are_generate_s(engine, model_dir, generation):
    config, backbone, full = engine_model(model_dir(generation), engine)
    # prefill: every prompt in one packed row (positions restart per sequence); then decode one token per sequence
    tokens = [t for p in PROMPTS for t in p]
    positions = [i for p in PROMPTS for i in range(len(p))]
    sequences = [s for s, p in enumerate(PROMPTS) for _ in p]
    nexts = engine_step(engine, config, backbone, full, tokens, positions, sequences)
    ends = [sum(len(p) for p in PROMPTS[: s + 1]) - 1 for s in range(len(PROMPTS))]
    generated = [[nexts[e]] for e in ends]
    for _ in range(STEPS - 1):
        last = [g[-1] for g in generated]
        where = [len(p) + len(g) - 1 for p, g in zip(PROMPTS, generated)]
        for g, t in zip(generated, engine_step(engine, config, backbone, full, last, where, list(range(len(PROMPTS))))):
            g.append(t)
    expected = [
        full.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=STEPS,
            do_sample=False,
            eos_token_id=None,
        )[0, len(p) :].tolist()
        for p in PROMPTS
    ]
    assert generated == expected
    assert "cache" not in engine.kwargs_seen and "past_key_values" not in engine.kwargs_seen  # no cache of ours


def test_g5_s_smear_refuses_the_engine_in_one_line(engine, model_dir):
    config, backbone, full = engine_model(model_dir("g5"), engine)
    with pytest.raises(ValueError, match=r"^smear \(nanochat G5\) mixes in each sequence's previous token"):
        engine_step(engine, config, backbone, full, PROMPTS[0], list(range(len(PROMPTS[0]))), [0] * len(PROMPTS[0]))
