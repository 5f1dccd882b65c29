"""nanochat's tokenizer and chat format on the Hugging Face stack."""

from .chat import normalize_messages, render_conversation, render_conversations, render_for_completion
from .nanochat_format import load_nanochat_tokenizer, save_nanochat_tokenizer, tokenizer_from_tiktoken
from .template import CHAT_TEMPLATE
from .tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    build_tokenizer,
    to_mergeable_ranks,
    token_bytes,
    train_tokenizer,
)

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "SPLIT_PATTERN",
    "build_tokenizer",
    "load_nanochat_tokenizer",
    "normalize_messages",
    "render_conversation",
    "render_conversations",
    "render_for_completion",
    "save_nanochat_tokenizer",
    "to_mergeable_ranks",
    "token_bytes",
    "tokenizer_from_tiktoken",
    "train_tokenizer",
]
