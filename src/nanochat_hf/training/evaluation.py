"""Validation bits per byte (docs/nanochat.md, section 5) and exact-match accuracy of generated answers."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from ..inference import generate_reply
from .device import to_device


@torch.no_grad()
def evaluate_bpb(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    token_bytes: torch.Tensor,
    device: torch.device | str,
) -> float:
    """Bits per byte over `batches` ({"input_ids", "labels"} rows of T+1 tokens; the model shifts).

    Per-token losses (nats) of targets whose token has >0 bytes are summed, together with the byte counts of all
    non-ignored targets; both sums are all-reduced across processes so every rank returns the same number.
    """
    token_bytes = token_bytes.to(device)
    # float32 accumulator, as nanochat: MPS has no float64
    nats = torch.zeros((), dtype=torch.float32, device=device)
    nbytes = torch.zeros((), dtype=torch.int64, device=device)
    was_training = model.training
    model.eval()
    for batch in batches:
        input_ids = to_device(batch["input_ids"], device)
        labels = to_device(batch["labels"], device)
        loss = model(input_ids=input_ids, labels=labels, loss_reduction="none").loss  # (B, T) nats
        targets = labels[:, 1:]
        valid = targets != -100
        nb = torch.where(valid, token_bytes[targets.clamp(min=0)], 0)
        nats += (loss.float() * (nb > 0)).sum()
        nbytes += nb.sum()
    model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(nats)
        dist.all_reduce(nbytes)
    if nbytes.item() == 0:
        return float("inf")
    return nats.item() / (math.log(2) * nbytes.item())


def exact_match_accuracy(model, tokenizer, conversations: Iterable[dict], max_new_tokens: int = 64) -> float:
    """Exact-match accuracy of greedy answers (text parts) against each conversation's final assistant message."""
    from ..evaluation.metrics import ExactMatch  # here: `evaluate` is only imported where a metric is computed

    metric = ExactMatch()
    for conv in conversations:
        reference = conv["messages"][-1]["content"]
        if not isinstance(reference, str):
            reference = "".join(part["text"] for part in reference if part["type"] == "text")
        reply = generate_reply(model, tokenizer, conv, max_new_tokens=max_new_tokens)
        metric.add(predictions=reply["text"], references=reference)
    return metric.compute()["exact_match"]
