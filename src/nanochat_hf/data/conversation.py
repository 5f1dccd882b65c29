"""How a conversation (docs/nanochat.md, section 3) is stored in a dataset row, and the check of a training
conversation (the schema and its validation are `tokenizer.chat_format`'s).

Row schema of every mixture dataset: ``{"conversation": str, "task": str}`` where ``conversation`` is the
JSON text of nanochat's ``{"messages": [...]}`` (Arrow cannot hold a column whose values are a string in one
row and a list of parts in another, so the conversation is kept as JSON, unchanged).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import UserError
from ..tokenizer.chat_format import check_conversation


def dumps(conversation: dict) -> str:
    return json.dumps(conversation, ensure_ascii=False)


def loads(row_or_text: dict | str) -> dict:
    """The conversation dict of a mixture row (or of its ``conversation`` JSON text)."""
    text = row_or_text["conversation"] if isinstance(row_or_text, dict) else row_or_text
    return json.loads(text)


def check_messages(messages: Any, **rules: bool) -> str | None:
    """Why ``messages`` is not a valid training conversation, or None when it is: `check_conversation` with at
    least a user and an assistant message; `rules` are its stricter options (identity files)."""
    try:
        check_conversation(messages, needs_reply=True, **rules)
    except UserError as e:
        return str(e)
    return None


def conversation_texts(conversation: dict) -> list[str]:
    """Every piece of text of a conversation (message contents and part texts), e.g. to train a tokenizer."""
    texts = []
    for msg in conversation["messages"]:
        content = msg["content"]
        texts.extend([content] if isinstance(content, str) else [p["text"] for p in content])
    return texts
