"""nanochat's tokenizer and chat format on the Hugging Face stack."""

from . import chat_format
from .chat import (
    normalize_messages,
    render_conversation,
    render_conversations,
    render_for_completion,
)
from .chat_format import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    PART_TYPES,
    SPECIAL_TOKENS,
    STOP_TOKENS,
    check_conversation,
    special_token_ids,
)
from .nanochat_format import (
    load_nanochat_tokenizer,
    save_nanochat_tokenizer,
    tokenizer_from_tiktoken,
)
from .template import CHAT_TEMPLATE
from .tokenizer import (
    SPLIT_PATTERN,
    TOKEN_BYTES_CONVENTIONS,
    build_tokenizer,
    to_mergeable_ranks,
    token_bytes,
    token_bytes_convention,
    train_tokenizer,
)

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
    "normalize_messages",
    "render_conversation",
    "render_conversations",
    "render_for_completion",
    "save_nanochat_tokenizer",
    "special_token_ids",
    "to_mergeable_ranks",
    "token_bytes",
    "token_bytes_convention",
    "tokenizer_from_tiktoken",
    "train_tokenizer",
]
