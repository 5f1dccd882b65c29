"""Configuration of the nanochat GPT (standalone: only stdlib and transformers imports, shipped as remote code)."""

import math

from transformers import PretrainedConfig

ROTARY_DTYPES = ("bfloat16", "float32")


class NanoChatGPTConfig(PretrainedConfig):
    """nanochat's GPT config, with nanochat's field names.

    The usual Hugging Face names (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``max_position_embeddings``) are aliases of the nanochat fields.

    ``final_logit_softcapping`` (transformers' name, read by TRL's fused loss) is nanochat's logit soft cap;
    ``logit_softcap``, the name older config.json files carry, is an alias of it.

    ``rotary_dtype`` is the precision of the rotary cos/sin tables: ``"bfloat16"`` rounds them as nanochat
    does (what trained checkpoints expect), ``"float32"`` keeps them exact (as transformers' NanoChat does).
    """

    model_type = "nanochat_gpt"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "num_key_value_heads": "n_kv_head",
        "max_position_embeddings": "sequence_len",
        "logit_softcap": "final_logit_softcapping",  # the name this config used before: old config.json files load
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

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_depth(cls, depth: int, vocab_size: int = 65536, sequence_len: int = 2048, **kwargs) -> "NanoChatGPTConfig":
        """nanochat's depth dial: d layers, 64*d wide, ceil(64*d/128) heads (d20 -> 20 layers, 1280 wide, 10 heads)."""
        n_head = math.ceil(64 * depth / 128)
        kwargs.setdefault("n_kv_head", n_head)
        return cls(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head,
                   n_embd=64 * depth, **kwargs)

    def to_nanochat_dict(self) -> dict:
        """The ``model_config`` block of a nanochat ``meta_<step>.json``."""
        keys = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
        return {k: getattr(self, k) for k in keys}


__all__ = ["NanoChatGPTConfig"]
