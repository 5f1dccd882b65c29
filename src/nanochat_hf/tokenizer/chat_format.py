"""nanochat's chat format in one place (docs/nanochat.md, sections 2 and 3): the special tokens, the roles and
the part types of assistant content, and the one validation of a conversation.

The renderer (`chat.py`), the Jinja chat template (`template.py`, built from these names and from `ERRORS`), the
tokenizer, the data tasks and inference all take them from here; no other Python code spells a special token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UserError

# The nine special tokens, in nanochat's order (a trained tokenizer gives them the last ids, in this order).
BOS = "<|bos|>"  # starts every document and every conversation
USER_START = "<|user_start|>"
USER_END = "<|user_end|>"
ASSISTANT_START = "<|assistant_start|>"
ASSISTANT_END = "<|assistant_end|>"
PYTHON_START = "<|python_start|>"  # the assistant calls the calculator: PYTHON_START expression PYTHON_END
PYTHON_END = "<|python_end|>"
OUTPUT_START = "<|output_start|>"  # the tool's result, forced at inference: OUTPUT_START result OUTPUT_END
OUTPUT_END = "<|output_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS,
    USER_START,
    USER_END,
    ASSISTANT_START,
    ASSISTANT_END,
    PYTHON_START,
    PYTHON_END,
    OUTPUT_START,
    OUTPUT_END,
)

BOS_TOKEN = BOS
EOS_TOKEN = ASSISTANT_END  # a chat turn ends here
# Padding uses bos, not eos: generic collators set labels == pad_token_id to -100, which must not hide
# <|assistant_end|> (the model has to learn to stop). Padding is on the left for batched generation.
PAD_TOKEN = BOS
STOP_TOKENS: tuple[str, ...] = (ASSISTANT_END, BOS)  # generation stops at either, as nanochat's engine

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
TEXT, PYTHON, PYTHON_OUTPUT = "text", "python", "python_output"
PART_TYPES: tuple[str, ...] = (TEXT, PYTHON, PYTHON_OUTPUT)  # of assistant content; user/system: text only
# the special tokens around each tool part of assistant content
PART_TOKENS: dict[str, tuple[str, str]] = {
    PYTHON: (PYTHON_START, PYTHON_END),
    PYTHON_OUTPUT: (OUTPUT_START, OUTPUT_END),
}

# Error texts of `check_conversation`. The chat template raises the same texts (template.py fills the fields with
# Jinja), so a bad conversation gets one message from the renderer and from `apply_chat_template`. A value in
# quotes is written as str(value), which Jinja's `~` also does; {kind} is the Python type name.
ERRORS: dict[str, str] = {
    "empty": "conversation is empty: 'messages' has no message",
    "message": "message {i} must be a dict with 'role' and 'content'",
    "system_alone": "message {i}: a system message must be followed by a user message",
    "role": "message {i} has role '{role}', expected '{expected}' (roles alternate)",
    "text_content": "message {i} ({role}) content must be a string or a list of text parts, got {kind}",
    "assistant_content": "message {i} (assistant) content must be a string or a list of parts, got {kind}",
    "text_part": "message {i} ({role}) content part {j}: part type '{type}', expected 'text'",
    "part": f"message {{i}} (assistant) content part {{j}}: unknown part type '{{type}}', expected one of {PART_TYPES}",
    "part_text": "message {i} ({role}) content part {j} text must be a string, got {kind}",
}


# apply_chat_template(..., tools=[...]): nanochat's format has no tool definitions, so they are refused, not dropped
TOOLS_ERROR = (
    "nanochat's chat format has no tool definitions, so tools=[...] cannot be rendered: its one tool, the "
    "calculator, is called with python parts of the assistant's content; leave tools out"
)


def _error(key: str, **fields: Any) -> UserError:
    return UserError(ERRORS[key].format(**fields))


def check_conversation(
    messages: Any, *, allow_system: bool = True, strings_only: bool = False, needs_reply: bool = False
) -> Sequence[Mapping]:
    """Validate a conversation's list of messages; return it unchanged. Raises UserError naming the message (and
    part) and what is expected.

    Valid: an optional leading system message, then user, assistant, ... alternating; user/system content a string
    or a list of text parts ``{"type": "text", "text": str}``; assistant content a string or a list of parts of
    `PART_TYPES`. Stricter rules of some callers: `allow_system=False` (no system message), `strings_only` (every
    content a string; both are nanochat's rules for identity conversations), `needs_reply` (at least a user and
    an assistant message: training data).
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise UserError(f"conversation 'messages' must be a list, got {type(messages).__name__}")
    if len(messages) == 0:
        raise _error("empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise _error("message", i=i)
    start = 1 if allow_system and messages[0]["role"] == SYSTEM else 0
    if start and (len(messages) < 2 or messages[1]["role"] != USER):
        raise _error("system_alone", i=0)
    for i, m in enumerate(messages):
        expected = SYSTEM if i < start else (USER if (i - start) % 2 == 0 else ASSISTANT)
        if m["role"] != expected:
            raise _error("role", i=i, role=m["role"], expected=expected)
        _check_content(m["content"], i, expected, strings_only)
    if needs_reply and len(messages) - start < 2:
        raise UserError(f"conversation needs a user and an assistant message, got {len(messages) - start} message(s)")
    return messages


def _check_content(content: Any, i: int, role: str, strings_only: bool) -> None:
    if isinstance(content, str):
        return
    kind = type(content).__name__
    if isinstance(content, Mapping) or not isinstance(content, Sequence):
        raise _error("assistant_content" if role == ASSISTANT else "text_content", i=i, role=role, kind=kind)
    allowed = PART_TYPES if role == ASSISTANT else (TEXT,)
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if not isinstance(part, Mapping) or part_type not in allowed:
            raise _error("part" if role == ASSISTANT else "text_part", i=i, j=j, role=role, type=part_type)
        if not isinstance(part.get("text"), str):
            raise _error("part_text", i=i, j=j, role=role, kind=type(part.get("text")).__name__)
    if strings_only:  # well-formed parts, but this caller takes strings only
        raise UserError(f"message {i} ({role}) content must be a string, got {kind}")


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """{special token: its id} of a nanochat tokenizer (any transformers tokenizer); one-line UserError naming
    the tokens it lacks."""
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIAL_TOKENS}
    missing = [name for name, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise UserError(f"tokenizer lacks nanochat special tokens {missing}: not a nanochat tokenizer")
    return ids
