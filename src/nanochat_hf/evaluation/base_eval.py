"""The rest of nanochat's base_eval.py around CORE (`core.py`): the model's samples and the CORE results' CSV."""

from __future__ import annotations

import torch

from .core import bos_id

SAMPLE_PROMPTS = [  # nanochat's base_eval.py
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
]


def _until_stop(row: list[int], start: int, stops: set[int]) -> list[int]:
    """The prompt and its completion up to (without) the first stop token, as nanochat's Engine returns them."""
    for i in range(start, len(row)):
        if row[i] in stops:
            return row[:i]
    return row


@torch.no_grad()
def base_samples(
    model,
    tokenizer,
    prompts: list[str] = SAMPLE_PROMPTS,
    max_tokens: int = 16,
    unconditioned: int = 8,
    unconditioned_tokens: int = 128,
    seed: int | None = None,
) -> tuple[list[str], list[str]]:
    """nanochat's base_eval samples: each prompt (after BOS) continued greedily for `max_tokens`, then
    `unconditioned` samples from BOS alone at temperature 1 for `unconditioned_tokens`; generation stops at BOS
    (or EOS). Returns the decoded texts (prompt included, as nanochat prints them)."""
    device = next(model.parameters()).device
    bos = bos_id(tokenizer)
    stops = {bos} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    common = dict(eos_token_id=sorted(stops), pad_token_id=bos)
    conditioned = []
    for prompt in prompts:
        ids = [bos, *tokenizer(prompt, add_special_tokens=False, split_special_tokens=True)["input_ids"]]
        ids_t = torch.tensor([ids], device=device)
        out = model.generate(
            ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=max_tokens, do_sample=False, **common
        )
        conditioned.append(tokenizer.decode(_until_stop(out[0].tolist(), len(ids), stops)))
    if seed is not None:
        torch.manual_seed(seed)
    start = torch.tensor([[bos]], device=device)
    out = model.generate(
        start,
        attention_mask=torch.ones_like(start),
        num_return_sequences=unconditioned,
        max_new_tokens=unconditioned_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        **common,
    )
    return conditioned, [tokenizer.decode(_until_stop(row.tolist(), 1, stops)) for row in out]


def core_csv(core: dict) -> str:
    """The CORE results as nanochat's base_eval writes them (base_eval/<model>.csv): task, accuracy, centered."""
    lines = [f"{'Task':<35}, {'Accuracy':<10}, {'Centered':<10}"]
    for label, accuracy in core["results"].items():
        lines.append(f"{label:<35}, {accuracy:<10.6f}, {core['centered_results'][label]:<10.6f}")
    lines.append(f"{'CORE':<35}, {'':<10}, {core['core_metric']:<10.6f}")
    return "\n".join(lines) + "\n"
