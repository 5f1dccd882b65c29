"""nanochat's tokenizer and chat format on the Hugging Face stack."""

from __future__ import annotations

from ..lazy import lazy_exports
from . import chat_format  # light (no tokenizers, no torch)

# name -> the submodule defining it, imported on first use (see nanochat_hf.lazy)
_WHERE = {
    **dict.fromkeys(
        ("normalize_messages", "render_conversation", "render_conversations", "render_for_completion"), "chat"
    ),
    **dict.fromkeys(
        (
            "BOS_TOKEN",
            "EOS_TOKEN",
            "PAD_TOKEN",
            "PART_TYPES",
            "SPECIAL_TOKENS",
            "STOP_TOKENS",
            "check_conversation",
            "special_token_ids",
        ),
        "chat_format",
    ),
    **dict.fromkeys(
        ("load_nanochat_tokenizer", "load_tokenizer_dir", "save_nanochat_tokenizer", "tokenizer_from_tiktoken"),
        "nanochat_format",
    ),
    "CHAT_TEMPLATE": "template",
    **dict.fromkeys(("save_tokenizer_dir", "train_bpe", "train_from_shards"), "training"),
    **dict.fromkeys(
        (
            "SPLIT_PATTERN",
            "TOKEN_BYTES_CONVENTIONS",
            "build_tokenizer",
            "to_mergeable_ranks",
            "token_bytes",
            "token_bytes_convention",
            "train_tokenizer",
        ),
        "tokenizer",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "PART_TYPES",
    "SPECIAL_TOKENS",
    "SPLIT_PATTERN",
    "STOP_TOKENS",
    "TOKEN_BYTES_CONVENTIONS",
    "build_tokenizer",
    "chat_format",
    "check_conversation",
    "load_nanochat_tokenizer",
    "load_tokenizer_dir",
    "normalize_messages",
    "render_conversation",
    "render_conversations",
    "render_for_completion",
    "save_nanochat_tokenizer",
    "save_tokenizer_dir",
    "special_token_ids",
    "to_mergeable_ranks",
    "token_bytes",
    "token_bytes_convention",
    "tokenizer_from_tiktoken",
    "train_bpe",
    "train_from_shards",
    "train_tokenizer",
]
