"""The identity conversations (nanochat's CustomJSON task): a JSONL file, one JSON array of messages per line,
user/assistant only, string contents (nanochat's rule). ``identity`` reads nanochat's file
(`default_identity_path`), ``demo_identity`` the one shipped for the offline demo (identity_demo.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.conversation import check_messages
from ..paths import nanochat_base_dir
from .common import Task

DEMO_IDENTITY_FILE = Path(__file__).with_name("identity_demo.jsonl")


def default_identity_path() -> Path:
    """nanochat's identity file: $NANOCHAT_BASE_DIR (or ~/.cache/nanochat)/identity_conversations.jsonl."""
    return nanochat_base_dir() / "identity_conversations.jsonl"


def conversation(line: str) -> dict:
    """One line of the file -> conversation; ValueError saying why the line is not one."""
    try:
        messages = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    reason = check_messages(messages, allow_system=False, strings_only=True)
    if reason:
        raise ValueError(reason)
    return {"messages": messages}


IDENTITY = Task("CustomJSON", "file", key="identity", conversation=conversation, default_file=default_identity_path)
DEMO_IDENTITY = Task(
    "DemoIdentity", "file", key="demo_identity", conversation=conversation, default_file=lambda: DEMO_IDENTITY_FILE
)
