"""Continuous batching for every nanochat generation (G0-G5), each request with its own sampling and calculator.

One worker thread owns the model. Each step it prefills the requests that arrived (one left-padded forward), then
decodes one token for every running request in one forward: the running requests' KV caches are one left-padded
cache with its attention mask (``Slots``; positions follow from the mask, as in a left-padded ``generate()``), and
for smear (G5) each row passes its previous token (``previous_input_ids``, the model's own argument for it). New
requests join right-aligned with the running ones; a request leaves when it ends, is cancelled or its client goes
away: its row is dropped before the next step and columns no row needs any more are dropped.

Why ours and not transformers' continuous batching manager: that one takes one generation config for all requests
(greedy or the same sampling for all), has no per-request logits processor (no calculator) and keeps its KV cache
in pages, which cannot hold smear's previous token. Every cache layer here is a full one: sliding windows come
from the attention mask, so rows of different lengths pad and trim alike.

Each row chooses its token as ``generate()`` would for that request alone: float32 logits, the calculator tool
(``CalculatorToolProcessor`` on the row's own tokens, called where it can force a token), transformers'
temperature and top-k warpers, softmax, then ``torch.multinomial`` with the request's own ``torch.Generator``
seeded with its ``seed`` (the stream ``torch.manual_seed(seed)`` gives ``generate()``), or argmax when greedy.
The rows choose together: one argmax for all, the warpers once for the sampled rows that share their settings,
one softmax; only the calculator and the draw are per row.
"""

from __future__ import annotations

import secrets
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from transformers import GenerationConfig, TemperatureLogitsWarper, TopKLogitsWarper
from transformers.cache_utils import DynamicCache, DynamicLayer

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


class _Layer(DynamicLayer):
    """One layer of ``Slots`` as the model's cache sees it: ``update`` writes the step's keys and values into the
    buffers (column ``end`` on) and returns the rows' view up to them."""

    def __init__(self, slots: Slots, index: int):
        super().__init__()
        self.slots, self.index, self.is_initialized = slots, index, True

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.slots.write(self.index, keys, values)

    def get_seq_length(self) -> int:
        return self.slots.end - self.slots.start


class Slots:
    """The running rows' KV cache and attention mask (1 = a token, 0 = left padding) in buffers with room to grow:
    rows 0 to ``rows``, columns ``start`` to ``end``. A decoding step writes one column, requests join by writing
    their rows, a request leaves by moving the last row into its place, and columns no row needs any more are
    dropped by moving ``start``. Why not a DynamicCache: it concatenates, so every step (and every join and leave)
    copied the whole cache, which beside one long request cost more than the forward. Columns grow by doubling, so
    copying costs O(1) a token. Columns outside a row's tokens may hold another row's old values: the mask hides
    them (a masked column's weight is exactly 0)."""

    def __init__(self, prefill: DynamicCache, mask: torch.Tensor, rows: list[int], max_rows: int):
        self.max_rows = max_rows
        self.k = [layer.keys[:0, :, :0] for layer in prefill.layers]  # per layer: (rows, heads, columns, head_dim)
        self.v = [layer.values[:0, :, :0] for layer in prefill.layers]
        self.mask = mask[:0, :0]
        self.rows = self.start = self.end = 0
        self.cache = DynamicCache()  # what the model is given: its layers write into these buffers
        self.cache.layers = [_Layer(self, i) for i in range(len(prefill.layers))]
        self.join(prefill, mask, rows)

    def _place(self, rows: int, left: int) -> None:
        """New buffers with room for `rows` rows, `left` columns before the current ones and more after."""
        width = self.end - self.start
        columns = 2 * (left + width) + 64
        capacity = self.mask.shape[0] if rows <= self.mask.shape[0] else max(rows, min(2 * rows, self.max_rows))
        old, new = slice(self.start, self.end), slice(left, left + width)

        def moved(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(capacity, t.shape[1], columns, t.shape[3])
            out[: self.rows, :, new] = t[: self.rows, :, old]
            return out

        self.k, self.v = [moved(t) for t in self.k], [moved(t) for t in self.v]
        mask = self.mask.new_zeros(capacity, columns)
        mask[: self.rows, new] = self.mask[: self.rows, old]
        self.mask, self.start, self.end = mask, left, left + width

    def join(self, prefill: DynamicCache, mask: torch.Tensor, rows: list[int]) -> None:
        """The prefill's `rows` join the batch (their columns that are tokens, right-aligned with the others)."""
        first = int(mask[rows].any(0).nonzero()[0])
        width = mask.shape[1] - first  # the columns they use
        if width > self.end or self.rows + len(rows) > self.mask.shape[0]:
            self._place(self.rows + len(rows), max(width - (self.end - self.start), 0))
        start = min(self.start, self.end - width) if self.rows else self.end - width
        self.mask[: self.rows, start : self.start] = 0  # columns the running rows did not have: padding for them
        self.start = start
        index, at = torch.tensor(rows, device=mask.device), slice(self.rows, self.rows + len(rows))
        theirs = [layer.keys for layer in prefill.layers] + [layer.values for layer in prefill.layers]
        for mine, new in zip(self.k + self.v, theirs):
            mine[at, :, self.end - width : self.end] = new[index, :, first:]
        self.mask[at, self.start : self.end] = 0
        self.mask[at, self.end - width : self.end] = mask[index, first:]
        self.rows += len(rows)

    def keep(self, rows: list[int]) -> list[int]:
        """Only these rows (ascending) stay: the last ones move into the places of those that leave. Returns, for
        each place, the row that is there now."""
        n, columns, kept = len(rows), slice(self.start, self.end), set(rows)
        order = list(range(n))
        for hole, mover in zip([i for i in range(n) if i not in kept], [i for i in rows if i >= n]):
            for t in (*self.k, *self.v):
                t[hole, :, columns] = t[mover, :, columns]
            self.mask[hole, columns] = self.mask[mover, columns]
            order[hole] = mover
        self.rows = n
        if n:  # drop the columns that are padding in every row
            self.start += int(self.mask[:n, columns].any(0).nonzero()[0])
        return order

    def decode(self, model, **inputs) -> Any:
        """The model's forward on one new column (every row's next token), written into the buffers."""
        if self.end == self.mask.shape[1]:
            self._place(self.rows, 0)
        self.mask[: self.rows, self.end] = 1
        out = model(attention_mask=self.mask[: self.rows, self.start : self.end + 1], cache=self.cache, **inputs)
        self.end += 1
        return out

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values for the new column; all the rows' keys and values so far."""
        k, v = self.k[layer], self.v[layer]
        k[: self.rows, :, self.end : self.end + 1] = keys
        v[: self.rows, :, self.end : self.end + 1] = values
        return k[: self.rows, :, self.start : self.end + 1], v[: self.rows, :, self.start : self.end + 1]


class Batcher:
    """The worker thread and its queue: ``submit(job)`` from any thread, ``stop()`` once; ``after_step`` is called
    by the worker after each step (``engine`` sends the step's tokens on from there)."""

    def __init__(self, model, tokenizer, max_batch: int, max_queue: int, after_step: Callable[[], None] | None = None):
        self.model, self.max_batch, self.max_queue, self.after_step = model, max_batch, max_queue, after_step
        self.device = next(model.parameters()).device
        self.smear = bool(getattr(model.config, "smear", False))
        self.calculator = CalculatorToolProcessor(tokenizer)
        self.waiting: deque[Job] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        # the running batch: one row per job, its cache holding every token but each row's last
        self.active: list[Job] = []
        self.slots: Slots | None = None
        self.thread = threading.Thread(target=self._run, name="nanochat-batcher", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise ShuttingDown
            if len(self.waiting) >= self.max_queue:  # those whose clients have gone hold no place
                self.waiting = deque(j for j in self.waiting if not j.sink.cancelled.is_set())
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
                self.active, self.slots = [], None
            if self.after_step:
                self.after_step()

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
        going = self._advance(new, out.logits[:, -1])
        if not going:
            return
        if self.slots is None:
            self.slots = Slots(cache, mask, going, self.max_batch)
        else:
            self.slots.join(cache, mask, going)
        self.active += [new[i] for i in going]

    def _decode(self) -> None:
        keep = [i for i, job in enumerate(self.active) if not job.sink.cancelled.is_set()]
        if len(keep) < len(self.active):
            self._keep(keep)
            if not self.active:
                return
        rows = len(self.active)
        extra = {}
        if self.smear:  # the token before each row's new one
            extra["previous_input_ids"] = torch.tensor([j.tokens[-2] for j in self.active], device=self.device)
        out = self.slots.decode(
            self.model,
            input_ids=torch.tensor([[j.tokens[-1]] for j in self.active], device=self.device),
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        keep = self._advance(self.active, out.logits[:, -1])
        if len(keep) < rows:
            self._keep(keep)

    def _keep(self, rows: list[int]) -> None:
        self.active = [self.active[i] for i in self.slots.keep(rows)]
        if not rows:
            self.slots = None

    def _advance(self, jobs: list[Job], logits: torch.Tensor) -> list[int]:
        """Choose each job's next token from its row of logits and hand it on; the indices of the jobs that go on."""
        tokens = self._choose(jobs, logits)
        return [i for i, (job, token) in enumerate(zip(jobs, tokens)) if self._hand_on(job, token)]

    def _choose(self, jobs: list[Job], logits: torch.Tensor) -> list[int]:
        """Each row's token as generate() chooses it for that request alone, for all rows at once: per row the
        calculator (where it can force a token), then argmax (greedy) or transformers' warpers, softmax and a draw
        from the row's own generator. The warpers run once for the sampled rows that share a temperature and top_k,
        softmax once for all (the same bits as row by row): a sampled row cost 0.32 ms row by row, 0.25 ms in a
        batch of 8 of which 0.14 ms is its draw."""
        scores = logits.to(torch.float32)
        tool = self.calculator
        for i, job in enumerate(jobs):
            # the calculator's own test of whether it forces this row's token (a call just closed, or its output
            # being written), made without building the row's tensor: only then is the processor called
            if job.calculator and (job.tokens[-1] == tool.python_end or job.last_special == tool.output_start):
                scores[i : i + 1] = tool(torch.tensor([job.tokens], device=self.device), scores[i : i + 1])
        tokens = scores.argmax(-1).tolist()
        groups: dict[tuple[float, int], list[int]] = {}  # the sampled rows, by their settings
        for i, job in enumerate(jobs):
            if job.temperature > 0:
                groups.setdefault((job.temperature, job.top_k or DEFAULT_TOP_K), []).append(i)
        if not groups:
            return tokens
        rows = [i for group in groups.values() for i in group]
        warped = [  # as generate(): temperature, then top-k (the warpers read no ids)
            TopKLogitsWarper(top_k)(None, TemperatureLogitsWarper(temperature)(None, scores[group]))
            for (temperature, top_k), group in groups.items()
        ]
        probs = torch.softmax(torch.cat(warped), dim=-1)
        draws = [torch.multinomial(probs[n : n + 1], 1, generator=jobs[i].generator) for n, i in enumerate(rows)]
        for i, token in zip(rows, torch.cat(draws).flatten().tolist()):
            tokens[i] = token
        return tokens

    def _hand_on(self, job: Job, token: int) -> bool:
        """The job's token to its sink; whether the job goes on."""
        job.tokens.append(token)
        if token in self.calculator.special_set:
            job.last_special = token
        job.sink.add([token])
        if job.sink.finished or job.sink.cancelled.is_set():
            return False
        if len(job.tokens) - len(job.prompt) >= job.max_new:
            job.sink.end()
            return False
        return True
