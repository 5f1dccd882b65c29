"""Configuration of the nanochat GPT (standalone: only stdlib and transformers imports, shipped as remote code)."""

import math

from transformers import PretrainedConfig

ROTARY_DTYPES = ("bfloat16", "float32", "compute")
LAYER_TYPES = ("full_attention", "sliding_attention")


class NanoChatGPTConfig(PretrainedConfig):
    """nanochat's GPT config, with nanochat's field names.

    The usual Hugging Face names (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``max_position_embeddings``) are aliases of the nanochat fields.

    ``final_logit_softcapping`` (transformers' name, read by TRL's fused loss) is nanochat's logit soft cap.

    ``rotary_dtype`` is the precision of the rotary cos/sin tables: ``"bfloat16"`` rounds them as nanochat did up
    to 1076f97 (the December model and G1-G3 checkpoints), ``"compute"`` makes them in the dtype the model computes
    in (bfloat16 under bf16 autocast or with bf16 weights, else float32) as nanochat does since 1076f97 (G4, G5),
    ``"float32"`` keeps them exact (as transformers' NanoChat does).

    nanochat's later model generations (G1 to G5, January to March 2026) are switched on by the fields below the
    December ones; their defaults give the December 2025 model (G0) exactly:

    - ``pad_vocab_size_to``: ``wte``, ``lm_head`` and value embeddings have ``vocab_size`` rounded up to a multiple
      of this many rows (nanochat pads to 64 since bc51da8); logits are cropped back to ``vocab_size``.
    - ``residual_lambdas`` (G1): per-layer scalars ``resid_lambdas`` and ``x0_lambdas``; before block i,
      ``x = resid_lambdas[i] * x + x0_lambdas[i] * x0`` with ``x0`` the normed embedding.
    - ``layer_types`` / ``sliding_window`` (G2, transformers' names): ``"full_attention"`` or
      ``"sliding_attention"`` per layer (default all full, the G0 model); a sliding layer's query sees
      ``sliding_window`` keys, itself included (nanochat's window ``w``, FlashAttention's ``window_size=(w, 0)``,
      is ``sliding_window - 1``). nanochat's long layers ("L") have the window ``sequence_len``: the same as full
      attention up to ``sequence_len + 1`` tokens (all nanochat trains on); beyond that, nanochat's long layers
      drop the oldest keys and ours (full attention) keep them.
    - ``value_embeddings`` (G3): ``value_embeds.{i}`` and ``attn.ve_gate`` on the layers with
      ``i % 2 == (n_layer - 1) % 2`` (the last layer and every other one before it);
      ``v += ve_gate_scale * sigmoid(ve_gate(x[..., :ve_gate_channels])) * ve``
      per key/value head (G3: 32 channels, scale 2; G4 on: 12 channels, scale 3).
    - ``qk_scale`` (G4: 1.15, G5: 1.2): q and k are multiplied by it after the QK-norm.
    - ``smear`` (G5): ``smear_gate`` and ``smear_lambda`` mix the previous token's normed embedding into each
      position; ``backout`` (G5): ``backout_lambda`` times the residual after block ``n_layer // 2`` is
      subtracted before the final norm.

    Parameter names are nanochat's; the ones nanochat's ``GPT`` keeps outside ``transformer`` (``resid_lambdas``,
    ``x0_lambdas``, ``value_embeds.*``, ``smear_*``, ``backout_lambda``) sit in the backbone, so they read
    ``transformer.<nanochat name>`` here. A model with ``residual_lambdas`` created from scratch gets nanochat's
    ``init_weights`` of G5/HEAD (the G0 model keeps the December init).
    """

    model_type = "nanochat_gpt"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]  # the KV cache field (renamed in transformers 5.24)
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "num_key_value_heads": "n_kv_head",
        "max_position_embeddings": "sequence_len",
    }

    sequence_len: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int | None = None  # None: same as n_head (no GQA)
    n_embd: int = 768
    final_logit_softcapping: float = 15.0
    rope_theta: float = 10000.0
    rotary_dtype: str = "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False
    # nanochat generations G1 to G5 (see the class docstring); the defaults are the December 2025 model (G0)
    pad_vocab_size_to: int = 1
    residual_lambdas: bool = False
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    value_embeddings: bool = False
    ve_gate_channels: int = 32
    ve_gate_scale: float = 2.0
    qk_scale: float = 1.0
    smear: bool = False
    backout: bool = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)  # applies the HF aliases passed as kwargs (via attribute_map)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim n_embd // n_head ({self.head_dim}) must be even for rotary embeddings")
        if self.rotary_dtype not in ROTARY_DTYPES:
            raise ValueError(f"rotary_dtype must be one of {ROTARY_DTYPES}, got {self.rotary_dtype!r}")
        if self.pad_vocab_size_to < 1:
            raise ValueError(f"pad_vocab_size_to must be at least 1, got {self.pad_vocab_size_to}")
        if self.layer_types is None:  # transformers' mask helpers read layer_types whenever the attribute exists
            self.layer_types = ["full_attention"] * self.n_layer
        if len(self.layer_types) != self.n_layer or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(
                f"layer_types must list one of {LAYER_TYPES} for each of the {self.n_layer} layers, "
                f"got {self.layer_types!r}"
            )
        if self.value_embeddings and not 0 < self.ve_gate_channels <= self.n_embd:
            raise ValueError(
                f"ve_gate_channels must be between 1 and n_embd ({self.n_embd}), got {self.ve_gate_channels}"
            )
        if self.smear and self.n_embd < 24:
            raise ValueError(
                f"smear reads the first 24 channels of the embedding: n_embd must be at least 24, got {self.n_embd}"
            )
        if "sliding_attention" in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise ValueError(
                f"sliding_window must be a positive number of keys when a layer is "
                f"'sliding_attention', got {self.sliding_window!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of ``wte``, ``lm_head`` and the value embeddings: ``vocab_size`` rounded up to ``pad_vocab_size_to``."""
        return -(-self.vocab_size // self.pad_vocab_size_to) * self.pad_vocab_size_to

    @property
    def value_embedding_layers(self) -> list[int]:
        """The layers with a value embedding (nanochat's rule: every other layer, the last one included)."""
        if not self.value_embeddings:
            return []
        return [i for i in range(self.n_layer) if i % 2 == (self.n_layer - 1) % 2]

    @classmethod
    def from_depth(cls, depth: int, vocab_size: int = 65536, sequence_len: int = 2048, **kwargs) -> "NanoChatGPTConfig":
        """nanochat's depth dial: d layers, 64*d wide, ceil(64*d/128) heads (d20 -> 20 layers, 1280 wide, 10 heads)."""
        n_head = math.ceil(64 * depth / 128)
        kwargs.setdefault("n_kv_head", n_head)
        return cls(
            sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head, n_embd=64 * depth, **kwargs
        )

    def to_nanochat_dict(self) -> dict:
        """The ``model_config`` block of a nanochat ``meta_<step>.json``."""
        keys = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
        return {k: getattr(self, k) for k in keys}


__all__ = ["NanoChatGPTConfig"]
