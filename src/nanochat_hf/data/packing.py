"""Packing tokenized conversations into nanochat's micro-batches, each rank reading its own share."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset

from ..errors import UserError


@runtime_checkable
class MicroBatchStream(Protocol):
    """What the trainer (`nanochat_hf.training.MidTrainer`) reads from a rank's stream of micro-batches.

    `PackedStream` is the recipe's; a trainer subclass may feed another through `MidTrainer.make_stream`.
    """

    def read(self, count: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The next `count` micro-batches (None: endless): {"input_ids", "labels"}, LongTensors (B, T+1)."""
        ...

    def num_micro_batches(self) -> int:
        """Micro-batches in one epoch, the same on every rank."""
        ...

    def epoch_steps(self, grad_accum: int) -> int:
        """Optimizer steps of one epoch (num_iterations = -1), the same on every rank."""
        ...

    def lr_progress(self, step: int, grad_accum: int) -> float:
        """The schedule's progress (0..1) at optimizer step `step` (num_iterations = -1)."""
        ...

    def state_dict(self) -> dict:
        """The position after the last micro-batch handed out (JSON-serialisable), saved in checkpoints."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Resume from a `state_dict()`."""
        ...


class _Sequence:
    """Token counts along the conversation sequence a rank reads: conversations (rank + j*W) mod N, j = 0, 1, ...

    This is nanochat's generator cursor (it starts at the rank, steps by W and wraps around the dataset), so a
    share of the next epoch continues where this one stopped. The sequence is periodic (period N / gcd(N, W)).
    """

    def __init__(self, lengths: np.ndarray, rank: int, world_size: int):
        n = len(lengths)
        self.size, self.rank, self.world_size = n, rank, world_size
        self.period = n // math.gcd(n, world_size)
        self.index = (rank + np.arange(self.period, dtype=np.int64) * world_size) % n
        self.cum = np.cumsum(lengths[self.index])
        self.period_tokens = int(self.cum[-1])
        if self.period_tokens == 0:
            raise UserError("PackedStream: every conversation is empty")

    def tokens_before(self, k: int) -> int:
        """Tokens of the first k conversations of the sequence."""
        q, j = divmod(k, self.period)
        return q * self.period_tokens + (int(self.cum[j - 1]) if j else 0)

    def read_before(self, tokens: np.ndarray | int) -> np.ndarray:
        """Conversations the generator has read once `tokens` (> 0) tokens were filled: the smallest k with
        tokens_before(k) >= tokens (vectorised)."""
        q, rem = np.divmod(np.asarray(tokens, dtype=np.int64) - 1, self.period_tokens)
        return q * self.period + np.searchsorted(self.cum, rem + 1, side="left") + 1

    def consumed_whole(self, tokens: int) -> int:
        """Conversations lying entirely within the first `tokens` tokens."""
        q, rem = divmod(tokens, self.period_tokens)
        return q * self.period + int(np.searchsorted(self.cum, rem, side="right"))


def check_stream_inputs(
    kind: str, token_ds: Dataset, max_seq_len: int, device_batch_size: int, rank: int, world_size: int
) -> None:
    """One-line error for arguments no micro-batch stream (`kind`: its class name) can work with: `UserError` for
    settings and data, ValueError for a caller's mistake (a rank outside the world, an untokenized dataset)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if max_seq_len < 1 or device_batch_size < 1:
        raise UserError(f"max_seq_len and device_batch_size must be >= 1, got {max_seq_len} and {device_batch_size}")
    missing = {"input_ids", "labels"} - set(token_ds.column_names)
    if missing:
        raise ValueError(
            f"{kind} needs a tokenized dataset (tokenize_conversations): no column {', '.join(sorted(missing))}"
        )
    if len(token_ds) < world_size:
        raise UserError(f"{kind}: {len(token_ds)} conversations for {world_size} processes")


def conversation_lengths(token_ds: Dataset) -> np.ndarray:
    """Tokens per conversation (the `num_tokens` column when tokenization wrote it)."""
    table = token_ds.with_format("arrow")
    if "num_tokens" in token_ds.column_names:
        return np.asarray(table["num_tokens"], dtype=np.int64)
    return pc.list_value_length(table["input_ids"]).to_numpy().astype(np.int64)


class PackedStream(MicroBatchStream):
    """Micro-batches ``{"input_ids": LongTensor(B, T+1), "labels": LongTensor(B, T+1)}`` (CPU), nanochat's way.

    Rank ``r`` of ``W`` reads conversations r, r+W, r+2W, ... (wrapping around the dataset as nanochat's cursor
    does) into one running token stream. Micro-batch m is tokens ``[m*(B*T+1), (m+1)*(B*T+1))`` of that stream;
    row b is tokens ``[b*T, b*T + T + 1)`` of the micro-batch, so consecutive rows share one token and the
    model's shift gives nanochat's (B, T) inputs/targets exactly. No padding; documents cross row and batch
    boundaries, and the stream runs on into the next epoch without dropping the leftover tokens.

    ``num_micro_batches()``: whole micro-batches the SMALLEST rank share holds (the same on every rank);
    iterating yields the rest of that many (one "epoch" block), iterating again continues the stream;
    ``read(count)`` yields ``count`` micro-batches across epoch blocks (validation, which wraps around).
    ``epoch_steps(G)`` / ``lr_progress(step, G)`` are nanochat's end of epoch and schedule progress, computed
    on every rank from the lengths of all conversations (no communication), so all ranks agree.
    ``state_dict()`` records the position after the last micro-batch handed out; ``load_state_dict()`` resumes.
    Do not iterate it from DataLoader worker processes (the position lives in this object).
    """

    def __init__(
        self,
        token_ds: Dataset,
        max_seq_len: int,
        device_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        chunk_size: int = 1024,
    ):
        check_stream_inputs("PackedStream", token_ds, max_seq_len, device_batch_size, rank, world_size)
        self.ds = token_ds.with_format("arrow")
        self.T, self.B, self.rank, self.world_size = max_seq_len, device_batch_size, rank, world_size
        self.chunk_size = chunk_size
        self.tokens_per_batch = device_batch_size * max_seq_len + 1
        self._lengths = lengths = conversation_lengths(token_ds)
        shares = [int(lengths[r::world_size].sum()) for r in range(world_size)]
        self._num = min(shares) // self.tokens_per_batch
        self._seq = _Sequence(lengths, rank, world_size)
        self._seq0 = self._seq if rank == 0 else _Sequence(lengths, 0, world_size)
        self.micro_batches = 0  # handed out since the start, across epochs

    def num_micro_batches(self) -> int:
        """Whole micro-batches in the smallest rank share: the same on every rank."""
        return self._num

    def __len__(self) -> int:
        return self._num

    @property
    def epoch(self) -> int:
        """Epoch block of the last micro-batch handed out (0 before any)."""
        return max(0, self.micro_batches - 1) // self._num if self._num else 0

    @property
    def progress(self) -> float:
        """Fraction of the current epoch block handed out (0..1)."""
        if not self._num:
            return 1.0
        return (self.micro_batches - self.epoch * self._num) / self._num

    # ---- nanochat's epoch end and schedule progress -----------------------------------------------------
    def epoch_steps(self, grad_accum: int) -> int:
        """Optimizer steps nanochat runs for one epoch with `grad_accum` micro-batches per step.

        nanochat draws the first micro-batch before step 0 and each next one right after a backward; the
        micro-batch (1-based count M) whose filling reads a rank's last conversation of the epoch sets the
        last-step flag, the step during which it was drawn completes (its remaining micro-batches already
        read the next epoch) and the run stops: floor((M - 2) / G) + 1 steps. Ranks agree on the earliest.
        """
        steps = []
        for r in range(self.world_size):
            share = self._lengths[r :: self.world_size]
            first_to_wrap = int(share[:-1].sum()) // self.tokens_per_batch + 1  # M
            steps.append((first_to_wrap - 2) // grad_accum + 1)
        return min(steps)

    def lr_progress(self, step: int, grad_accum: int) -> float:
        """nanochat's schedule progress for optimizer step `step` (from 0): the running maximum of
        cursor / dataset size over the micro-batches drawn after step 0's first backward up to the first
        micro-batch of step `step + 1`. The cursor is rank 0's (every rank computes the same value).
        """
        drawn = np.arange(2, (step + 1) * grad_accum + 2, dtype=np.int64)  # micro-batch counts 2..(s+1)G+1
        read = self._seq0.read_before(drawn * self.tokens_per_batch)
        cursor = (read * self.world_size) % self._seq0.size
        return float(cursor.max()) / self._seq0.size

    # ---- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "micro_batches": self.micro_batches,
            "epoch": self.epoch,
            "max_seq_len": self.T,
            "device_batch_size": self.B,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_micro_batches": self._num,
        }

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (
            ("max_seq_len", self.T),
            ("device_batch_size", self.B),
            ("rank", self.rank),
            ("world_size", self.world_size),
            ("num_micro_batches", self._num),
        ):
            if state.get(key) != mine:
                raise UserError(
                    f"data state does not match this stream: {key}={state.get(key)} in the saved state, "
                    f"{mine} here (same data and batch settings are needed to resume)"
                )
        if not isinstance(state.get("micro_batches"), int) or state["micro_batches"] < 0:
            raise UserError(f"data state: micro_batches={state.get('micro_batches')!r}, expected an integer >= 0")
        self.micro_batches = state["micro_batches"]

    # ---- reading ----------------------------------------------------------------------------------------
    def __iter__(self):
        """The rest of the current epoch block (a whole block when the previous one was finished)."""
        if not self._num:
            return iter(())
        left = self._num - self.micro_batches % self._num
        return self.read(left)

    def read(self, count: int | None = None):
        """The next `count` micro-batches (None: endless), running on across epochs."""
        consumed = self.micro_batches * self.tokens_per_batch
        k = self._seq.consumed_whole(consumed)  # conversations entirely handed out already
        skip = consumed - self._seq.tokens_before(k)
        ids_buf, lab_buf = np.empty(0, np.int64), np.empty(0, np.int64)
        chunks = self._conversations(k)
        n, made = self.tokens_per_batch, 0
        while count is None or made < count:
            while len(ids_buf) < n:
                ids, labels = next(chunks)
                ids_buf, lab_buf = np.concatenate([ids_buf, ids[skip:]]), np.concatenate([lab_buf, labels[skip:]])
                skip = 0
            batch = {"input_ids": self._rows(ids_buf[:n]), "labels": self._rows(lab_buf[:n])}
            ids_buf, lab_buf = ids_buf[n:], lab_buf[n:]
            self.micro_batches += 1
            made += 1
            yield batch

    def _conversations(self, k: int):
        """(input_ids, labels) numpy arrays of the sequence's conversations from position k on, in chunks."""
        seq = self._seq
        while True:
            positions = np.arange(k, k + self.chunk_size) % seq.period
            table = self.ds.data.table.take(pa.array(self._rows_of(seq.index[positions])))
            k += self.chunk_size
            yield (
                pc.list_flatten(table["input_ids"]).to_numpy().astype(np.int64),
                pc.list_flatten(table["labels"]).to_numpy().astype(np.int64),
            )

    def _rows_of(self, indices: np.ndarray) -> np.ndarray:
        """Dataset row numbers of logical indices (a dataset made by select/shuffle has an indices mapping)."""
        mapping = self.ds._indices
        if mapping is None:
            return indices
        return mapping.column(0).to_numpy()[indices]

    def _rows(self, flat: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(flat).unfold(0, self.T + 1, self.T).contiguous()
