"""Python renderer of conversations to (ids, mask), exactly as nanochat does it for training (docs/nanochat.md,
section 3).

Each piece of text is encoded on its own and as ordinary text: a literal "<|bos|>" typed inside a message is
encoded as the characters it is made of, never as the special token (as tiktoken's `encode_ordinary`).

The chat template (`CHAT_TEMPLATE`) renders the same token sequence and mask, with two exceptions that follow
from rendering one string and tokenizing it as a whole:
- two adjacent assistant text parts are concatenated before tokenization, so tokens may merge across the
  boundary (the renderer keeps them apart, as nanochat does);
- a special-token string typed inside a message becomes the special token;
and the template never truncates, where the renderer (and so `render_for_completion`) cuts at `max_tokens`.
Everywhere else (system merge, tool parts, outputs) special tokens sit between pieces and the pre-tokenizer
cannot merge across them, so both agree; the tests check it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from ..errors import UserError
from .chat_format import (
    ASSISTANT_END,
    ASSISTANT_START,
    BOS,
    PART_TOKENS,
    PYTHON,
    SYSTEM,
    TEXT,
    USER,
    USER_END,
    USER_START,
    check_conversation,
    special_token_ids,
)

# tokenizer -> (len(tokenizer), ordinary-text backend, special token ids); built once per tokenizer object.
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _renderer(tokenizer: PreTrainedTokenizerFast) -> tuple[Tokenizer, dict[str, int]]:
    hit = _CACHE.get(tokenizer)
    if hit is not None and hit[0] == len(tokenizer):
        return hit[1], hit[2]
    ids = special_token_ids(tokenizer)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.encode_special_tokens = True  # special-token strings in text are plain text
    backend.no_padding()
    backend.no_truncation()
    _CACHE[tokenizer] = (len(tokenizer), backend, ids)
    return backend, ids


def _joined(content: str | Sequence[Mapping]) -> str:
    """User/system content (validated): a string, or a list of text parts (what pipelines and TRL send), joined."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def normalize_messages(conversation: Mapping | Sequence) -> list[dict]:
    """Validate a conversation (`check_conversation`) and merge a leading system message into the first user one.

    `conversation` is ``{"messages": [...]}`` or the list of messages. User and system content may be a list of
    text parts; it is returned as one string. Returns messages alternating user, assistant, ... (new dicts; the
    input is not modified). Raises UserError naming the message and what is wrong.
    """
    if isinstance(conversation, Mapping):
        if "messages" not in conversation:
            raise UserError("conversation must have a 'messages' list")
        conversation = conversation["messages"]
    out = [dict(m) for m in check_conversation(conversation)]
    system = ""
    if out[0]["role"] == SYSTEM:
        system = _joined(out.pop(0)["content"]) + "\n\n"
    for m in out:
        if m["role"] == USER:
            m["content"] = _joined(m["content"])
    out[0]["content"] = system + out[0]["content"]
    return out


def _plan(messages: list[dict], ids: dict[str, int], texts: list[str]) -> list[tuple[int, int, int]]:
    """Rendering plan: (token id or -1, text index into `texts` or -1, mask) in order; appends to `texts`."""
    plan = [(ids[BOS], -1, 0)]

    def text(value: str, mask: int) -> None:
        plan.append((-1, len(texts), mask))
        texts.append(value)

    for m in messages:
        if m["role"] == USER:
            plan.append((ids[USER_START], -1, 0))
            text(m["content"], 0)
            plan.append((ids[USER_END], -1, 0))
            continue
        plan.append((ids[ASSISTANT_START], -1, 0))
        content = m["content"]
        parts = [{"type": TEXT, "text": content}] if isinstance(content, str) else content
        for part in parts:
            if part["type"] == TEXT:
                text(part["text"], 1)
                continue
            # python: the call is trained on; python_output: written by the tool at inference, not trained on
            mask = 1 if part["type"] == PYTHON else 0
            opening, closing = PART_TOKENS[part["type"]]
            plan.append((ids[opening], -1, mask))
            text(part["text"], mask)
            plan.append((ids[closing], -1, mask))
        plan.append((ids[ASSISTANT_END], -1, 1))
    return plan


def _assemble(plan: list[tuple[int, int, int]], encoded: list[list[int]], max_tokens: int | None):
    out_ids: list[int] = []
    out_mask: list[int] = []
    for token, text_idx, mask in plan:
        if token >= 0:
            out_ids.append(token)
            out_mask.append(mask)
        else:
            piece = encoded[text_idx]
            out_ids.extend(piece)
            out_mask.extend([mask] * len(piece))
        if max_tokens is not None and len(out_ids) >= max_tokens:
            break
    if max_tokens is not None:
        del out_ids[max_tokens:], out_mask[max_tokens:]
    return out_ids, out_mask


def _encode(backend: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]


def render_conversations(
    tokenizer: PreTrainedTokenizerFast, conversations: Sequence[Mapping], max_tokens: int | None = 2048
) -> tuple[list[list[int]], list[list[int]]]:
    """Batched `render_conversation` (one tokenizer call for all texts): for `datasets.map(batched=True)`."""
    backend, ids = _renderer(tokenizer)
    texts: list[str] = []
    plans = []
    for i, conv in enumerate(conversations):
        try:
            plans.append(_plan(normalize_messages(conv), ids, texts))
        except UserError as e:
            raise UserError(f"conversation {i} of the batch: {e}") from None
    encoded = _encode(backend, texts)
    rendered = [_assemble(plan, encoded, max_tokens) for plan in plans]
    return [r[0] for r in rendered], [r[1] for r in rendered]


def render_conversation(
    tokenizer: PreTrainedTokenizerFast, conversation: Mapping, max_tokens: int | None = 2048
) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation as nanochat renders it for training; mask 1 = trained assistant token.

    Truncated to `max_tokens` (None: no truncation). Raises UserError for a malformed conversation.
    """
    backend, ids = _renderer(tokenizer)
    texts: list[str] = []
    plan = _plan(normalize_messages(conversation), ids, texts)
    return _assemble(plan, _encode(backend, texts), max_tokens)


def render_for_completion(
    tokenizer: PreTrainedTokenizerFast, conversation: Mapping, max_tokens: int | None = 2048
) -> list[int]:
    """Prompt ids for generation, as nanochat builds them: the conversation without its last assistant message,
    rendered as for training and truncated to `max_tokens` (None: no truncation), then <|assistant_start|>.

    A prompt over the limit thus keeps its first `max_tokens` tokens, and the result is `max_tokens + 1` long.
    """
    messages = normalize_messages(conversation)
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    prompt, _ = render_conversation(tokenizer, {"messages": messages}, max_tokens=max_tokens)
    return prompt + [_renderer(tokenizer)[1][ASSISTANT_START]]
