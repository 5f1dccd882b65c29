"""The rest of nanochat's base_eval.py around CORE (`core.py`): bits per byte on the pretraining shards, the
model's samples and the CORE results' CSV."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..errors import UserError
from .core import NANOCHAT_MODEL_TYPES, bos_id

SPLIT_TOKENS = 40 * 524288  # nanochat's --split-tokens: tokens per split for bits per byte

SAMPLE_PROMPTS = [  # nanochat's base_eval.py
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
]


def bpb_steps(split_tokens: int, device_batch_size: int, sequence_len: int, world_size: int) -> int:
    """Micro-batches per rank, as nanochat: split_tokens rounded down to a multiple of the tokens of one step of
    all ranks (at least one step)."""
    return max(1, split_tokens // (device_batch_size * sequence_len * world_size))


def check_bpb(data_dir: str | os.PathLike | None = None, model=None) -> None:
    """UserError in one line when bits per byte cannot run: no shards (`find_shards`), or a model that is not
    nanochat's (its per-token losses are what is summed)."""
    from ..data.pretraining import find_shards, split_shards

    split_shards(find_shards(data_dir), "val")
    if model is not None and model.config.model_type != NANOCHAT_MODEL_TYPES[0]:
        kind = model.config.model_type
        raise UserError(f"--eval bpb needs a nanochat_gpt model (per-token losses); this one is {kind}")


def base_bpb(
    model,
    tokenizer,
    device_batch_size: int = 32,
    split_tokens: int = SPLIT_TOKENS,
    data_dir: str | os.PathLike | None = None,
    splits: tuple[str, ...] = ("train", "val"),
) -> dict[str, float]:
    """nanochat's base_eval bits per byte: for each split, the first `bpb_steps` micro-batches of the pretraining
    stream (`nanochat_hf.data.pretraining`: HEAD's shards and best-fit rows of sequence_len + 1 tokens, each rank
    its share) through `training.evaluation.evaluate_bpb` (all-reduced). Needs nanochat's model (its per-token
    losses); UserError in one line otherwise."""
    from ..data.pretraining import PretrainStream
    from ..tokenizer import token_bytes
    from ..training.evaluation import evaluate_bpb

    check_bpb(data_dir, model)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    T = model.config.sequence_len
    steps = bpb_steps(split_tokens, device_batch_size, T, world)
    if steps * device_batch_size * T * world != split_tokens and rank == 0:
        print(f"Adjusted split_tokens to {steps * device_batch_size * T * world} (must be divisible by "
              f"{device_batch_size * T * world})", flush=True)  # fmt: skip
    device = next(model.parameters()).device
    sizes = token_bytes(tokenizer)
    results = {}
    for split in splits:
        stream = PretrainStream(tokenizer, device_batch_size, T, split, rank, world, data_dir=data_dir)
        results[split] = evaluate_bpb(model, stream.read(steps), sizes, device)
    return results


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
