"""Conversation schema (docs/nanochat.md, section 3), its validation, and how a conversation is stored in a
dataset row.

Row schema of every mixture dataset: ``{"conversation": str, "task": str}`` where ``conversation`` is the
JSON text of nanochat's ``{"messages": [...]}`` (Arrow cannot hold a column whose values are a string in one
row and a list of parts in another, so the conversation is kept as JSON, unchanged).
"""

from __future__ import annotations

import json
from typing import Any

PART_TYPES = ("text", "python", "python_output")


def dumps(conversation: dict) -> str:
    return json.dumps(conversation, ensure_ascii=False)


def loads(row_or_text: dict | str) -> dict:
    """The conversation dict of a mixture row (or of its ``conversation`` JSON text)."""
    text = row_or_text["conversation"] if isinstance(row_or_text, dict) else row_or_text
    return json.loads(text)


def _type_name(x: Any) -> str:
    return type(x).__name__


def check_messages(messages: Any) -> str | None:
    """Return why ``messages`` is not a valid nanochat conversation, or None when it is.

    Valid: an optional leading system message, then user/assistant alternating (user first), at least one
    of each; user/system content a string; assistant content a string or a non-empty list of parts
    ``{"type": "text"|"python"|"python_output", "text": str}``.
    """
    if not isinstance(messages, list):
        return f"messages must be a list, got {_type_name(messages)}"
    if not messages:
        return "empty conversation"
    start = 1 if isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    if len(messages) - start < 2:
        return f"conversation needs a user and an assistant message, got {len(messages) - start} message(s)"
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return f"message {i}: expected an object, got {_type_name(msg)}"
        role, content = msg.get("role"), msg.get("content")
        expected = "system" if i < start else ("user" if (i - start) % 2 == 0 else "assistant")
        if role != expected:
            return f"message {i}: expected role '{expected}', got {role!r} (roles must alternate user/assistant)"
        if isinstance(content, str):
            continue
        if role != "assistant":
            return f"message {i}: {role} content must be a string, got {_type_name(content)}"
        if not isinstance(content, list) or not content:
            return (f"message {i}: assistant content must be a string or a non-empty list of parts, "
                    f"got {_type_name(content)}")
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
                kind = part.get("type") if isinstance(part, dict) else _type_name(part)
                return f"message {i} part {j}: unknown part type {kind!r} (expected one of {', '.join(PART_TYPES)})"
            if not isinstance(part.get("text"), str):
                return f"message {i} part {j}: text must be a string, got {_type_name(part.get('text'))}"
    return None


def conversation_texts(conversation: dict) -> list[str]:
    """Every piece of text of a conversation (message contents and part texts), e.g. to train a tokenizer."""
    texts = []
    for msg in conversation["messages"]:
        content = msg["content"]
        texts.extend([content] if isinstance(content, str) else [p["text"] for p in content])
    return texts
