"""A run's data shards dealt to another number of processes, so that a run resumes on W' processes with the
micro-batches it would have read on its first W.

nanochat's data is per rank: rank r of W reads its own stream (conversations r, r+W, ...; `PackedStream`,
`BestFitStream`), so the rows of a step depend on W. A resumed run keeps the W streams of the run that started it
(its "data shards", saved in every checkpoint) and deals their micro-batches to its W' processes: each optimizer
step takes ``accum`` micro-batches from every shard, numbered shard by shard (shard 0's first, ..., shard 1's
first, ...), and process p gets the step's micro-batches [p*n, (p+1)*n), n = shards * accum / W'. Every micro-batch
is one of the original run's, whole, so the step's gradient (the mean of the micro-batches' mean losses) is the
original one up to summation order; `SHARD_LAST` marks each shard's last micro-batch of a step (nanochat logs the
mean of those losses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from ..errors import UserError
from .packing import MicroBatchStream

SHARD_LAST = "shard_last"  # key of the marker DealtStream adds to every micro-batch (a 0-d bool tensor)


class DealtStream(MicroBatchStream):
    """This process's micro-batches of ``shards`` data shards (``make(s)``: shard s's stream, i.e. the stream of
    rank s of ``shards``), ``accum`` micro-batches per shard per step, dealt to ``world_size`` processes (module
    docstring). Its state is every shard's state; `shard_states` / `load_shard_states` save and load them."""

    def __init__(
        self, make: Callable[[int], MicroBatchStream], shards: int, accum: int, rank: int, world_size: int
    ) -> None:
        if shards * accum % world_size:
            raise UserError(
                f"the run's data is {shards} shards of {accum} micro-batches per step: {shards * accum} micro-batches "
                f"per step do not divide among {world_size} processes (use a number of processes dividing "
                f"{shards * accum}, with the same --device_batch_size and --total_batch_size)"
            )
        self.shards, self.accum, self.per_rank = shards, accum, shards * accum // world_size
        self.slots = range(rank * self.per_rank, (rank + 1) * self.per_rank)  # this process's micro-batches
        touched = range(self.slots[0] // accum, (self.slots[-1] // accum) + 1)
        self.streams = {s: make(s) for s in touched}
        self.first_of = {s: s * accum in self.slots for s in touched}  # whether this process saves shard s's state

    def read(self, count: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The next ``count`` micro-batches of this process (None: endless). Each step's micro-batches of every
        shard it touches are read before the first is handed out, so that between steps every shard stands at the
        step's end (what a checkpoint saves)."""
        made = 0
        while count is None or made < count:
            step = [
                (s * self.accum + m, batch)
                for s, stream in self.streams.items()
                for m, batch in enumerate(stream.read(self.accum))
            ]
            for slot, batch in step:
                if slot in self.slots and (count is None or made < count):
                    made += 1
                    yield {**batch, SHARD_LAST: torch.tensor(slot % self.accum == self.accum - 1)}

    def _any(self) -> MicroBatchStream:
        return next(iter(self.streams.values()))  # epoch and schedule: every shard's stream computes the same

    def num_micro_batches(self) -> int:
        return self._any().num_micro_batches() // self.accum * self.per_rank

    def epoch_steps(self, grad_accum: int) -> int:
        return self._any().epoch_steps(self.accum)

    def lr_progress(self, step: int, grad_accum: int) -> float:
        return self._any().lr_progress(step, self.accum)

    def state_dict(self) -> dict:
        raise TypeError("DealtStream holds several shards' states: use shard_states()")

    def load_state_dict(self, state: dict) -> None:
        raise TypeError("DealtStream holds several shards' states: use load_shard_states()")

    def shard_states(self) -> dict[int, dict]:
        """The states this process saves: of the shards whose first micro-batch of a step is its own."""
        return {s: stream.state_dict() for s, stream in self.streams.items() if self.first_of[s]}

    def load_shard_states(self, read: Callable[[int], dict]) -> None:
        for s, stream in self.streams.items():
            stream.load_state_dict(read(s))
