"""nanochat's GPT as a transformers model: the backbone ``NanoChatGPTModel`` and the causal LM / sequence
classification heads on top of it.

Standalone (only torch, transformers and the sibling configuration file), so it ships as remote code.
The backbone is mounted as ``transformer`` (holding ``wte`` and ``h``), so parameter names are exactly nanochat's
and a nanochat state dict of the December model loads with ``strict=True``; the later generations' top-level
parameters (scalars, smear gate, value embeddings) live in the backbone too, as ``transformer.<nanochat name>``.
"""

import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.output_capturing import capture_outputs

from .configuration_nanochat_gpt import NanoChatGPTConfig

# the outputs' cache field: `cache` from transformers 5.24 on (the old name still works there, with a warning)
CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
# the forwards take the KV cache as `cache` and the old keyword `past_key_values` as transformers 5.24's own models
# do: renamed, with a FutureWarning. Before 5.24 generate() itself passes `past_key_values`: renamed silently there
# (a version already past makes deprecate_kwarg rename without a warning).
cache_kwarg = deprecate_kwarg("past_key_values", "5.40.0" if CACHE == "cache" else "0", new_name="cache")
SMEAR_CHANNELS = 24  # smear_gate reads the first 24 channels of the normed embedding (nanochat G5)
SMEAR_PAGED = (
    "smear (nanochat G5) mixes in each sequence's previous token, which a KV cache kept outside the model "
    "(continuous batching's paged cache, an inference engine's attention) does not give: use generate()"
)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    # parameter-free, default eps (torch computes it in float32 with float32's eps, also for bf16 inputs)
    return F.rms_norm(x, (x.size(-1),))


def rotary_cos_sin(
    config: NanoChatGPTConfig, position_ids: torch.Tensor, hidden_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (B, T, head_dim) for the given positions, computed in float32 then rounded to
    ``config.rotary_dtype``; ``"compute"``: the dtype the model computes in, the autocast dtype when autocast is on
    for their device, else `hidden_dtype` (the embedding's output), as nanochat since 1076f97 (``COMPUTE_DTYPE``).
    Computed for the positions in use, so there is no maximum length.

    Full width, with the sign of the rotation folded into sin (``cat(cos, cos)``, ``cat(sin, -sin)``): built once
    per forward, they make each of the 2 * n_layer rotations a roll, two products and a sum (see ``apply_rotary``)."""
    hd = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=position_ids.device) / hd)
    )
    angles = position_ids.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    sin = angles.sin()
    sin[..., hd // 2 :].neg_()
    device = position_ids.device.type
    if config.rotary_dtype != "compute":
        dtype = getattr(torch, config.rotary_dtype)
    elif torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = hidden_dtype
    cos = angles.cos()
    if dtype == torch.bfloat16:
        cos, sin = round_to_bfloat16(cos), round_to_bfloat16(sin)
    return cos.to(dtype), sin.to(dtype)


def round_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to the nearest bfloat16 value (ties to even), kept in float32: the same values as
    ``x.to(torch.bfloat16)``, for finite x. Why not that cast alone: torch.compile's inductor drops a float32 ->
    bfloat16 -> float32 round trip inside a fused kernel (``emulate_precision_casts`` is off by default), so a
    compiled model multiplied float32 activations by the unrounded tables (logits off by ~5e-3 from eager on a G0
    model); integer arithmetic on the bits is not elided."""
    if torch.jit.is_tracing():  # convert.py to-onnx traces no bit view; a cast rounds to nearest even there too
        return x.to(torch.bfloat16).to(torch.float32)
    bits = x.view(torch.int32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000  # keep the top 16 bits, rounded to nearest even
    return bits.view(torch.float32)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd); cos/sin: (B, T, hd) from ``rotary_cos_sin``. nanochat's convention (rotation by -theta
    on halves x1, x2): ``cat(x1 cos + x2 sin, x2 cos - x1 sin)``, written as ``x * cos + swap_halves(x) * sin``
    with the sign in the table, the same products and sums, so bit-identical."""
    cos, sin = cos[:, None], sin[:, None]
    return (x * cos + x.roll(x.size(-1) // 2, dims=-1) * sin).to(x.dtype)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """Plain matmul-softmax attention (``attn_implementation="eager"``), returns (B, T, H, hd) and the weights."""
    n_rep = module.num_key_value_groups
    key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is None:  # no mask given: plain causal (query i is the last T_q keys' i-th)
        q_len, k_len = query.shape[2], key.shape[2]
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
        scores = scores.masked_fill(~causal, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    else:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class NanoChatGPTAttention(nn.Module):
    def __init__(self, config: NanoChatGPTConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.num_key_value_groups = config.n_head // config.n_kv_head  # read by transformers' attention functions
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.c_q = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj.zero_init = True
        # G2: a sliding layer's query sees the last `sliding_window` keys (transformers' attention functions read it)
        self.sliding_window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None
        # G3: value embedding mixed into v through a per-kv-head gate read from the first channels of the input
        self.ve_gate = None
        if layer_idx in config.value_embedding_layers:
            self.ve_gate = nn.Linear(config.ve_gate_channels, self.n_kv_head, bias=False)
            self.ve_gate.small_uniform_init = True

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None,
        ve: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns the output and the attention weights (None unless the eager implementation computed them).
        ``ve``: this layer's value embedding of the input tokens, (B, T, n_kv_head * head_dim), or None."""
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:  # nanochat's order: the gated value embedding is added before RoPE and QK-norm
            gate = self.config.ve_gate_scale * torch.sigmoid(self.ve_gate(x[..., : self.config.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        v = v.transpose(1, 2)
        q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        q, k = rms_norm(q), rms_norm(k)  # QK-norm after RoPE
        if self.config.qk_scale != 1.0:  # G4 on: sharper attention
            q, k = q * self.config.qk_scale, k * self.config.qk_scale
        if cache is not None:
            # kwargs: a paged cache (continuous batching) reads its read/write indices there and sets per-layer ones
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        y, weights = attention(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.c_proj(y.reshape(B, T, -1)), weights


class NanoChatGPTMLP(nn.Module):
    def __init__(self, config: NanoChatGPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_fc.uniform_init_scale = 0.4  # nanochat's init from G1 on (see _init_weights)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)
        self.c_proj.zero_init = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class NanoChatGPTBlock(GradientCheckpointingLayer):
    def __init__(self, config: NanoChatGPTConfig, layer_idx: int):
        super().__init__()
        self.attn = NanoChatGPTAttention(config, layer_idx)
        self.mlp = NanoChatGPTMLP(config)

    def forward(self, x: torch.Tensor, cos_sin, attention_mask=None, cache=None, ve=None, **kwargs) -> torch.Tensor:
        x = x + self.attn(rms_norm(x), cos_sin, attention_mask, cache, ve, **kwargs)[0]
        return x + self.mlp(rms_norm(x))


class NanoChatGPTPreTrainedModel(PreTrainedModel):
    config_class = NanoChatGPTConfig
    config: NanoChatGPTConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NanoChatGPTBlock"]
    _skip_keys_device_placement = [CACHE]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = False
    _supports_attention_backend = True
    # torch.compile(fullgraph=True) of the forward, decoding with a static cache, gives the eager tokens (checked on
    # CPU; compiling takes minutes there, so it is not in the tests). generate() auto-compiles with a static cache
    # on GPUs when this is set.
    _can_compile_fullgraph = True
    # what output_hidden_states / output_attentions collect (transformers' output-capturing hooks): the input of
    # the first block then each block's output, and the attention modules' second output (the weights)
    _can_record_outputs = {"hidden_states": NanoChatGPTBlock, "attentions": NanoChatGPTAttention}

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights after the token embedding. transformers reads the first parameter, which is the
        embedding, and nanochat trains on CUDA with a bfloat16 embedding and float32 elsewhere: save_pretrained
        writes this dtype to config.json and from_pretrained builds the model in it, so the first parameter would
        turn a float32 model into bfloat16 on reload."""
        return next(p.dtype for p in reversed(list(self.parameters())) if p.is_floating_point())

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        # transformers writes only the saved class into the remote-code auto_map; name every class of this file so
        # AutoModel / AutoModelForSequenceClassification load any saved directory too (the files are the same)
        if self._auto_class is not None:
            heads = {
                "AutoModel": "NanoChatGPTModel",
                "AutoModelForCausalLM": "NanoChatGPTForCausalLM",
                "AutoModelForSequenceClassification": "NanoChatGPTForSequenceClassification",
            }
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                **{auto: f"modeling_nanochat_gpt.{name}" for auto, name in heads.items()},
            }
        return super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # nanochat's init. transformers.initialization functions skip tensors already loaded by from_pretrained.
        if self.config.residual_lambdas:  # the generations from G1 on: nanochat's init_weights at HEAD
            self._init_weights_since_g1(module)
        elif isinstance(module, nn.Linear):
            if getattr(module, "zero_init", False):  # lm_head, attn.c_proj, mlp.c_proj
                init.zeros_(module.weight)
            else:
                fan_out, fan_in = module.weight.shape
                std = fan_in**-0.5 * min(1.0, (fan_out / fan_in) ** 0.5)
                init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=1.0)

    def _init_weights_since_g1(self, module: nn.Module) -> None:
        """nanochat's ``GPT.init_weights`` at a825e63/HEAD: uniform block matrices with the std of N(0, 1/n_embd)
        (``c_fc`` 0.4x), zero output projections, wte N(0, 0.8), lm_head N(0, 0.001), value embeddings like c_v,
        gates U(0, 0.02), scalars by depth."""
        c = self.config
        s = 3**0.5 * c.n_embd**-0.5
        if isinstance(module, nn.Linear):
            if getattr(module, "small_uniform_init", False):  # ve_gate, smear_gate
                init.uniform_(module.weight, 0.0, 0.02)
            elif module is getattr(self, "lm_head", None):
                init.normal_(module.weight, mean=0.0, std=0.001)
            elif getattr(module, "zero_init", False):  # attn.c_proj, mlp.c_proj
                init.zeros_(module.weight)
            else:  # c_q, c_k, c_v, c_fc; also a classification head
                bound = s * getattr(module, "uniform_init_scale", 1.0)
                init.uniform_(module.weight, -bound, bound)
        elif isinstance(module, nn.Embedding):
            if getattr(module, "value_embedding", False):
                init.uniform_(module.weight, -s, s)
            else:
                init.normal_(module.weight, mean=0.0, std=0.8)
        elif isinstance(module, NanoChatGPTModel):
            depth = torch.arange(c.n_layer, dtype=torch.float64) / max(c.n_layer - 1, 1)
            init.copy_(module.resid_lambdas, 1.15 - 0.10 * depth)
            init.copy_(module.x0_lambdas, 0.20 - 0.15 * depth)
            if c.smear:
                init.zeros_(module.smear_lambda)
            if c.backout:
                init.constant_(module.backout_lambda, 0.2)


class NanoChatGPTModel(NanoChatGPTPreTrainedModel):
    """The nanochat GPT backbone: token embedding ``wte`` and blocks ``h``, no LM head.

    ``last_hidden_state`` is after the final RMSNorm (what the LM head reads). With ``output_hidden_states`` it
    returns ``n_layer + 1`` tensors: the embedding after nanochat's post-embedding norm (the first block's input),
    the outputs of blocks 0..n_layer-2, and last the final block's output after the final norm (equal to
    ``last_hidden_state``, as in Llama). ``output_attentions`` returns weights with the eager attention only
    (``attn_implementation="eager"``); sdpa warns and returns none.
    """

    def __init__(self, config: NanoChatGPTConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)
        self.h = nn.ModuleList([NanoChatGPTBlock(config, i) for i in range(config.n_layer)])
        # the generations after December (see the config); nanochat's names, under this backbone's prefix
        if config.value_embeddings:  # G3 (registered before the float32 scalars: see ``dtype``)
            self.value_embeds = nn.ModuleDict(
                {
                    str(i): nn.Embedding(config.padded_vocab_size, config.n_kv_head * config.head_dim)
                    for i in config.value_embedding_layers
                }
            )
            for embedding in self.value_embeds.values():
                embedding.value_embedding = True
        if config.residual_lambdas:  # G1
            self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(config.n_layer))
        if config.smear:  # G5
            self.smear_gate = nn.Linear(SMEAR_CHANNELS, 1, bias=False)
            self.smear_gate.small_uniform_init = True
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if config.backout:  # G5
            self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.wte = value

    @cache_kwarg
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        previous_input_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """``previous_input_ids`` (B,): with smear (G5) and a non-empty cache, the token before each row's
        ``input_ids`` (generate() passes it), whose embedding smear mixes into the first new position. ``cache``: the
        KV cache (``past_key_values``, its name before transformers 5.24, still works, with a FutureWarning from 5.24
        on)."""
        c = self.config
        if c.value_embeddings:  # looked up by token: input_ids always, inputs_embeds (of the same tokens) optional
            if input_ids is None:
                raise ValueError(
                    "value embeddings (nanochat G3 on) are looked up by token: pass input_ids, alone or with "
                    "inputs_embeds (generate(input_ids=..., inputs_embeds=...))"
                )
            if inputs_embeds is not None and inputs_embeds.shape[:2] != input_ids.shape:
                raise ValueError(
                    f"inputs_embeds {tuple(inputs_embeds.shape[:2])} and input_ids {tuple(input_ids.shape)} must "
                    "cover the same tokens"
                )
        elif (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if use_cache is None:  # a cache only helps decoding, not training
            use_cache = c.use_cache and not self.training
        x = self.wte(input_ids) if inputs_embeds is None else inputs_embeds
        if use_cache and cache is None:
            cache = DynamicCache(config=c)
        if isinstance(attention_mask, dict):  # one mask per layer type, already built (generate() with a static cache)
            masks = attention_mask
        else:
            # given position_ids go to the mask too (transformers treats restarting positions as packed documents)
            # (the cache goes 4th by position: transformers 5.24 renamed that argument from past_key_values to cache)
            mask_args = (c, x, attention_mask, cache)
            masks = {"full_attention": create_causal_mask(*mask_args, position_ids=position_ids)}
            if "sliding_attention" in c.layer_types:  # G2: transformers' sliding-window mask (sliding_window keys)
                masks["sliding_attention"] = create_sliding_window_causal_mask(*mask_args, position_ids=position_ids)
        # continuous batching's paged cache (no Cache subclass), like an engine's own attention (vLLM's: transformers
        # builds it no mask), keeps the KV cache outside the model and packs every sequence into one row
        paged = cache is not None and not isinstance(cache, Cache)
        engine = c._attn_implementation not in (None, *ALL_MASK_ATTENTION_FUNCTIONS)  # None: eager
        if c.smear and (paged or engine):
            raise ValueError(SMEAR_PAGED)
        past = cache.get_seq_length() if cache is not None and not paged else 0
        if position_ids is None and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            # left padding: each row counts positions from its first real token (as generate() does)
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -x.shape[1] :]
        elif position_ids is None:
            position_ids = torch.arange(past, past + x.shape[1], device=x.device).unsqueeze(0)
        position_ids = position_ids.expand(x.shape[0], -1)
        cos_sin = rotary_cos_sin(c, position_ids, x.dtype)
        x = rms_norm(x)  # norm right after the embedding
        if c.smear:
            x = self._smear(x, past, previous_input_ids, position_ids)
        x0 = x  # G1: the normed (smeared) embedding, mixed back in before every block
        x_backout = None
        value_embeds = getattr(self, "value_embeds", {})
        for i, block in enumerate(self.h):
            if c.residual_lambdas:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = value_embeds[str(i)](input_ids).to(x.dtype) if str(i) in value_embeds else None
            x = block(x, cos_sin, attention_mask=masks[c.layer_types[i]], cache=cache, ve=ve, **kwargs)
            if c.backout and i == c.n_layer // 2:
                x_backout = x
        if x_backout is not None:  # G5: the mid-depth residual is subtracted before the final norm
            x = x - self.backout_lambda.to(x.dtype) * x_backout
        return BaseModelOutputWithPast(last_hidden_state=rms_norm(x), **{CACHE: cache if use_cache else None})

    def _smear(
        self, x: torch.Tensor, past: int, previous_input_ids: torch.LongTensor | None, position_ids: torch.LongTensor
    ) -> torch.Tensor:
        """G5: ``x[t] += smear_lambda * sigmoid(smear_gate(x[t, :24])) * x[t-1]`` on the normed embeddings (x[t-1]
        before smearing). With a cache the token before ``x`` is ``previous_input_ids``. A sequence's first token
        (position 0: the first position, the first real token after left padding, a packed document's start)
        takes nothing."""
        if past and previous_input_ids is None:
            raise ValueError(
                "smear (nanochat G5) mixes in the previous token's embedding: decoding with a "
                "non-empty cache needs previous_input_ids, the token before input_ids (generate() "
                "passes it)"
            )
        if past:
            previous = rms_norm(self.wte(previous_input_ids.reshape(-1, 1)))
            prev, cur = torch.cat([previous, x[:, :-1]], dim=1), x
        else:
            prev, cur = x[:, :-1], x[:, 1:]
        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(cur[..., :SMEAR_CHANNELS]))
        continues = position_ids[:, x.shape[1] - cur.shape[1] :] > 0  # has a previous token in its sequence
        gate = gate * continues[..., None].to(gate.dtype)
        smeared = cur + gate * prev
        return smeared if past else torch.cat([x[:, :1], smeared], dim=1)


class NanoChatGPTForCausalLM(NanoChatGPTPreTrainedModel, GenerationMixin):
    """nanochat GPT with an LM head: soft-capped float32 logits, HF label convention for the loss."""

    def __init__(self, config: NanoChatGPTConfig):
        super().__init__(config)
        self.transformer = NanoChatGPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.zero_init = True
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def num_flops_per_token(self) -> int:
        """Training FLOPs per token (nanochat's estimate): 6 * matmul params (all but the embeddings and the
        per-layer scalars) + the attention term, each sliding layer counting its window instead of sequence_len."""
        c = self.config
        n_matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        windows = [
            c.sequence_len if t == "full_attention" else min(c.sliding_window - 1, c.sequence_len)
            for t in c.layer_types
        ]
        return 6 * n_matmul + sum(12 * c.n_head * c.head_dim * w for w in windows)

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, *args, inputs_embeds: torch.Tensor | None = None, **kwargs
    ) -> dict:
        """transformers' inputs, plus what the later generations read by token: with value embeddings (G3 on) the
        prompt's ids next to its embeddings on the first step of generate(input_ids=..., inputs_embeds=...), with
        smear (G5) the token before the uncached ones (see the backbone). ``inputs_embeds`` is named here because
        generate() accepts them only from a model whose prepare_inputs_for_generation names them."""
        inputs = super().prepare_inputs_for_generation(input_ids, *args, inputs_embeds=inputs_embeds, **kwargs)
        new, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
        if self.config.value_embeddings and new is None and embeds is not None and input_ids.shape[1]:
            inputs["input_ids"] = new = input_ids[:, -embeds.shape[1] :]  # the backbone checks that they match
        if self.config.smear and new is not None and input_ids.shape[1] > new.shape[1]:
            inputs["previous_input_ids"] = input_ids[:, -new.shape[1] - 1]
        return inputs

    def _prepare_attention_mask_for_generation(
        self, inputs_tensor: torch.Tensor, generation_config, model_kwargs: dict
    ) -> torch.LongTensor:
        """generate() without an attention mask. transformers would mask every token equal to the pad token, and a
        nanochat tokenizer pads with <|bos|> (eos must stay visible to the loss, see the tokenizer), so it would
        mask the leading <|bos|> every sequence starts with. Every nanochat sequence starts with exactly one bos:
        when pad == bos, only the leading run of pad tokens except its last one is padding. This keeps left-padded
        batches right and makes generate(ids) equal generate(ids, attention_mask=ones)."""
        pad, bos = generation_config._pad_token_tensor, generation_config._bos_token_tensor
        if (
            pad is None
            or bos is None
            or inputs_tensor.dim() != 2
            or inputs_tensor.is_floating_point()
            or not torch.isin(pad, bos).any()
        ):
            return super()._prepare_attention_mask_for_generation(inputs_tensor, generation_config, model_kwargs)
        leading = (inputs_tensor == pad.reshape(-1)[0]).long().cumprod(-1).sum(-1, keepdim=True)  # pad run length
        positions = torch.arange(inputs_tensor.shape[-1], device=inputs_tensor.device)
        return (positions >= (leading - 1).clamp(min=0)).long()

    @cache_kwarg
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        loss_reduction: str = "mean",
        num_items_in_batch: int | torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Labels are aligned with input_ids (shifted inside), -100 ignored; ``shift_labels`` (a keyword, already
        aligned with the logits) replace them. ``loss_reduction``: "mean" (or sum / ``num_items_in_batch`` when
        given), "sum", or "none" -> per-token nats, 0 where ignored: (B, L-1) from labels, (B, L) from shift_labels.
        ``cache``: the KV cache (``past_key_values`` before transformers 5.24, see the backbone). ``past_key_values``
        is never set here (``cache_kwarg`` hands it over as ``cache``): it is named for generate() before 5.24, which
        passes it (assisted decoding too) and refuses arguments the forward does not name.

        ``shift_labels`` is taken through ``**kwargs`` on purpose: transformers' ``find_labels`` lists every forward
        argument with "label" in its name, and the Trainer computes an eval loss only when all of them are in the
        batch, so a named ``shift_labels`` would cost a plain ``Trainer.evaluate()`` its ``eval_loss``."""
        shift_labels = kwargs.pop("shift_labels", None)
        if use_cache is None:  # a cache only helps decoding: not when training or scoring labels
            use_cache = self.config.use_cache and not self.training and labels is None and shift_labels is None
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )  # an output object even if config.return_dict is False
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep])
        if self.config.padded_vocab_size != self.config.vocab_size:  # padding rows never become logits
            logits = logits[..., : self.config.vocab_size]
        logits = logits.float()
        cap = self.config.final_logit_softcapping
        logits = cap * torch.tanh(logits / cap)

        loss = None
        if labels is not None or shift_labels is not None:
            loss = self._loss(logits, labels, shift_labels, loss_reduction, num_items_in_batch)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **{CACHE: getattr(out, CACHE)},
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def _loss(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor | None,
        shift_labels: torch.Tensor | None,
        reduction: str,
        num_items_in_batch,
    ) -> torch.Tensor:
        """Sequence/context parallel training shifts the labels before it shards the sequence and hands the model
        ``shift_labels``; without them the last position has no target and is left out (not padded with -100: the
        sum then runs over the same terms in the same order as nanochat's loss, bit for bit)."""
        if shift_labels is None:
            if logits.shape[1] != labels.shape[1]:
                raise ValueError(
                    f"labels length {labels.shape[1]} != logits length {logits.shape[1]} "
                    "(logits_to_keep must be 0 when computing a loss)"
                )
            logits, shift_labels = logits[:, :-1], labels[:, 1:]
        elif shift_labels.shape != logits.shape[:2]:
            raise ValueError(
                f"shift_labels shape {tuple(shift_labels.shape)} != logits shape "
                f"{tuple(logits.shape[:2])} (logits_to_keep must be 0 when computing a loss)"
            )
        shift_labels = shift_labels.to(logits.device)
        if reduction == "mean":  # transformers' causal LM loss, handed the targets it would otherwise shift itself
            return self.loss_function(
                logits=logits.contiguous(),
                labels=None,
                vocab_size=logits.shape[-1],
                num_items_in_batch=num_items_in_batch,
                shift_labels=shift_labels.contiguous(),
            )
        if reduction == "none":
            return F.cross_entropy(logits.transpose(1, 2), shift_labels, ignore_index=-100, reduction="none")
        if reduction == "sum":
            return F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), shift_labels.reshape(-1), ignore_index=-100, reduction="sum"
            )
        raise ValueError(f"loss_reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


# generate() asks for inspect.signature(forward) of a remote-code model at every decoding step (transformers looks for
# a legacy cache_position argument); that costs more than a decoding step's rotary tables, so compute it once here
NanoChatGPTForCausalLM.forward.__signature__ = inspect.signature(NanoChatGPTForCausalLM.forward)


class NanoChatGPTForSequenceClassification(NanoChatGPTPreTrainedModel):
    """The backbone with a linear ``score`` head read at each row's last non-pad token (transformers' usual
    classification head; written here rather than via ``GenericForSequenceClassification``, which builds the
    backbone through ``AutoModel`` and so would need the package or a second remote-code prompt)."""

    def __init__(self, config: NanoChatGPTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = NanoChatGPTModel(config)
        self.score = nn.Linear(config.n_embd, self.num_labels, bias=False)
        self.post_init()

    @cache_kwarg
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )  # an output object even if config.return_dict is False
        logits = self.score(out.last_hidden_state)
        batch = logits.shape[0]
        if attention_mask is not None and attention_mask.dim() == 2:  # last real token, left or right padding
            positions = torch.arange(attention_mask.shape[-1], device=logits.device)
            last = (positions * attention_mask.to(logits.device, torch.long)).argmax(-1)
        elif input_ids is not None and self.config.pad_token_id is not None:
            # without a mask: the rightmost token that is not padding (the leading <|bos|> may equal pad)
            positions = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (positions * (input_ids != self.config.pad_token_id).to(logits.device, torch.long)).argmax(-1)
        else:
            if batch != 1 and input_ids is None:
                raise ValueError("batched inputs_embeds need an attention_mask to find each row's last token")
            last = torch.full((batch,), -1, device=logits.device)
        pooled = logits[torch.arange(batch, device=logits.device), last]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=pooled, config=self.config)
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled,
            **{CACHE: getattr(out, CACHE)},
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )


__all__ = [
    "NanoChatGPTForCausalLM",
    "NanoChatGPTForSequenceClassification",
    "NanoChatGPTModel",
    "NanoChatGPTPreTrainedModel",
]
