"""SmolTalk (HuggingFaceTB/smol-smoltalk): general conversations, system messages included, trained as they are."""

from __future__ import annotations

from .common import Task


def conversation(row: dict) -> dict:
    return {"messages": row["messages"]}


TASK = Task("SmolTalk", "hub", key="smoltalk", conversation=conversation, dataset="HuggingFaceTB/smol-smoltalk")
