"""The error contract of every entry point (mid_train, convert, chat, chat_eval, preview_data): bad input raises a
`ValueError` (or `OSError` for paths) whose message is one line naming the file, field or value and what is
expected; the entry point prints it once, as `one_line(error)`, and exits 2. Library errors that reach a user
(safetensors, tokenizers, datasets) are wrapped the same way, keeping `one_line` of their message."""

from __future__ import annotations


def one_line(error: BaseException | str) -> str:
    """The message on one line: its first line with whitespace collapsed (the error type's name if empty)."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return " ".join(text.splitlines()[0].split())
