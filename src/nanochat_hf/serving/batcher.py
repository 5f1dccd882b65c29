"""Continuous batching for every nanochat generation (G0-G5), each request with its own sampling and calculator.

One worker thread owns the model. Each step it prefills the requests that arrived (one left-padded forward), then
decodes one token for every running request in one forward: the running requests' KV caches are one left-padded
``DynamicCache`` with its attention mask (positions follow from the mask, as in a left-padded ``generate()``), and
for smear (G5) each row passes its previous token (``previous_input_ids``, the model's own argument for it). New
requests join by padding the shorter side on the left; a request leaves when it ends, is cancelled or its client
goes away: its row is dropped before the next step and columns no row needs any more are trimmed off.

Why ours and not transformers' continuous batching manager: that one takes one generation config for all requests
(greedy or the same sampling for all), has no per-request logits processor (no calculator) and keeps its KV cache
in pages, which cannot hold smear's previous token. Every cache layer here is a full one (``DynamicCache()``
without the config): sliding windows come from the attention mask, so rows of different lengths pad and trim alike.

Each row chooses its token as ``generate()`` would for that request alone: float32 logits, the calculator tool
(``CalculatorToolProcessor`` on the row's own tokens, called where it can force a token), transformers'
temperature and top-k warpers, softmax, then ``torch.multinomial`` with the request's own ``torch.Generator``
seeded with its ``seed`` (the stream ``torch.manual_seed(seed)`` gives ``generate()``), or argmax when greedy.
"""

from __future__ import annotations

import secrets
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import GenerationConfig, TemperatureLogitsWarper, TopKLogitsWarper
from transformers.cache_utils import DynamicCache

from ..inference import CalculatorToolProcessor

# generate() samples with this top_k when a request gives none (transformers' default, filled in at generate() time;
# read from there, its one owner, so that a reply equals generate()'s)
DEFAULT_TOP_K = GenerationConfig._get_default_generation_params()["top_k"]


class QueueFull(Exception):
    """More requests are waiting than the server takes (HTTP 429)."""


class ShuttingDown(Exception):
    """The server is stopping (HTTP 503)."""


class Sink(Protocol):
    """Where a request's tokens go (``server.ReplyStream``); ``finished`` once it needs no more (a stop string),
    ``cancelled`` when its client has gone."""

    finished: bool
    cancelled: threading.Event

    def add(self, new_tokens: list[int]) -> None: ...
    def end(self) -> None: ...
    def fail(self, message: str, status: int = 500) -> None: ...


@dataclass
class Job:
    """One request: its prompt and settings, and where its reply goes."""

    prompt: list[int]
    max_new: int
    temperature: float
    top_k: int | None
    seed: int | None
    calculator: bool
    sink: Sink
    tokens: list[int] = field(default_factory=list)  # prompt + reply so far (the calculator and smear read it)
    last_special: int | None = None  # the last special token of `tokens`
    generator: torch.Generator | None = None


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if width == 0:
        return t
    shape = list(t.shape)
    shape[dim] = width
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _rows(cache: DynamicCache, mask: torch.Tensor, rows: list[int]) -> tuple[DynamicCache, torch.Tensor]:
    """Only these rows, without the columns that are padding in all of them."""
    index = torch.tensor(rows, device=mask.device)
    mask = mask[index]
    first = int(mask.any(0).nonzero()[0])
    return _cache_of([(k[index, :, first:], v[index, :, first:]) for k, v in _layers(cache)]), mask[:, first:]


def _join(
    cache: DynamicCache, mask: torch.Tensor, other: DynamicCache, other_mask: torch.Tensor
) -> tuple[DynamicCache, torch.Tensor]:
    """Both batches' rows in one, the shorter padded on the left."""
    width = max(mask.shape[1], other_mask.shape[1])
    pads = width - mask.shape[1], width - other_mask.shape[1]
    layers = [
        tuple(torch.cat([_pad_left(a, pads[0], 2), _pad_left(b, pads[1], 2)]) for a, b in zip(mine, its))
        for mine, its in zip(_layers(cache), _layers(other))
    ]
    return _cache_of(layers), torch.cat([_pad_left(mask, pads[0], 1), _pad_left(other_mask, pads[1], 1)])


class Batcher:
    """The worker thread and its queue: ``submit(job)`` from any thread, ``stop()`` once."""

    def __init__(self, model, tokenizer, max_batch: int, max_queue: int):
        self.model, self.max_batch, self.max_queue = model, max_batch, max_queue
        self.device = next(model.parameters()).device
        self.smear = bool(getattr(model.config, "smear", False))
        self.calculator = CalculatorToolProcessor(tokenizer)
        self.waiting: deque[Job] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        # the running batch: one row per job, the cache holding every token but each row's last
        self.active: list[Job] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, columns) 1 = a token, 0 = left padding
        self.thread = threading.Thread(target=self._run, name="nanochat-batcher", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise ShuttingDown
            if len(self.waiting) >= self.max_queue:
                raise QueueFull
            self.waiting.append(job)
            self.cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Fail what is waiting and running (``the server is shutting down``) and end the worker."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout)
        for job in [*self.waiting, *self.active]:
            job.sink.fail("the server is shutting down", 503)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not (self.stopping or self.waiting or self.active):
                    self.cond.wait()
                if self.stopping:
                    return
                room = self.max_batch - len(self.active)
                new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            try:
                with torch.inference_mode():
                    self._admit(new)
                    if self.active:
                        self._decode()
            except Exception:  # a failed forward fails the requests it held; the server goes on with the next
                traceback.print_exc(file=sys.stderr)
                for job in {id(j): j for j in [*new, *self.active]}.values():
                    job.sink.fail("generation failed (the server's log says why)")
                self.active, self.cache, self.mask = [], None, None

    def _admit(self, new: list[Job]) -> None:
        """Prefill the new jobs (one left-padded forward), choose their first tokens, join them to the batch."""
        new = [job for job in new if not job.sink.cancelled.is_set()]
        if not new:
            return
        for job in new:
            if job.temperature > 0:
                seed = job.seed if job.seed is not None else secrets.randbits(63)
                job.generator = torch.Generator(self.device).manual_seed(seed)
            job.tokens = list(job.prompt)
            job.last_special = next((t for t in reversed(job.prompt) if t in self.calculator.special_set), None)
        width = max(len(job.prompt) for job in new)
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in new], device=self.device)
        cache = DynamicCache()
        out = self.model(
            input_ids=torch.tensor([[0] * (width - len(j.prompt)) + j.prompt for j in new], device=self.device),
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]
        going = [i for i, job in enumerate(new) if self._advance(job, logits[i])]
        if not going:
            return
        cache, mask = _rows(cache, mask, going)
        if self.active:
            cache, mask = _join(self.cache, self.mask, cache, mask)
        self.active += [new[i] for i in going]
        self.cache, self.mask = cache, mask

    def _decode(self) -> None:
        keep = [i for i, job in enumerate(self.active) if not job.sink.cancelled.is_set()]
        if len(keep) < len(self.active):
            self._keep(keep)
            if not self.active:
                return
        rows = len(self.active)
        mask = torch.cat([self.mask, self.mask.new_ones(rows, 1)], dim=1)
        extra = {}
        if self.smear:  # the token before each row's new one
            extra["previous_input_ids"] = torch.tensor([j.tokens[-2] for j in self.active], device=self.device)
        out = self.model(
            input_ids=torch.tensor([[j.tokens[-1]] for j in self.active], device=self.device),
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        self.mask = mask
        logits = out.logits[:, -1]
        keep = [i for i, job in enumerate(self.active) if self._advance(job, logits[i])]
        if len(keep) < rows:
            self._keep(keep)

    def _keep(self, rows: list[int]) -> None:
        self.active = [self.active[i] for i in rows]
        self.cache, self.mask = _rows(self.cache, self.mask, rows) if rows else (None, None)

    def _advance(self, job: Job, logits: torch.Tensor) -> bool:
        """Choose the job's next token from its logits and hand it on; whether the job goes on."""
        scores = logits.to(torch.float32)[None]
        tool = self.calculator
        # the calculator's own test of whether it forces this row's token (a call just closed, or its output being
        # written), made without building the row's tensor: only then is the processor called
        if job.calculator and (job.tokens[-1] == tool.python_end or job.last_special == tool.output_start):
            scores = tool(torch.tensor([job.tokens], device=self.device), scores)
        if job.temperature > 0:  # as generate(): temperature, then top-k, then a draw (the warpers read no ids)
            scores = TemperatureLogitsWarper(job.temperature)(None, scores)
            scores = TopKLogitsWarper(job.top_k or DEFAULT_TOP_K)(None, scores)
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=job.generator))
        else:
            token = int(scores.argmax(-1))
        job.tokens.append(token)
        if token in tool.special_set:
            job.last_special = token
        job.sink.add([token])
        if job.sink.finished or job.sink.cancelled.is_set():
            return False
        if len(job.tokens) - len(job.prompt) >= job.max_new:
            job.sink.end()
            return False
        return True
