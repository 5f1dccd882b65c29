"""nanochat HEAD's SFT loader: BOS-aligned best-fit packing with padding (scripts/chat_sft.py at 92d63d4,
`sft_data_generator_bos_bestfit`), as a `MicroBatchStream`.

Every row of a micro-batch starts at a conversation's BOS. Rank r of W fetches conversations r, r+W, r+2W, ...
(wrapping around the dataset) into a buffer kept at 100 conversations; a row is filled by taking, again and
again, the LONGEST buffered conversation that still fits entirely (the first one buffered among equals); when
none fits, the rest of the row is padding (BOS tokens, never a target). A conversation is never split across
rows. Rows hold max_seq_len + 1 tokens; the model's shift makes nanochat's (B, T) inputs and targets.

Labels are the tokenized dataset's (`tokenize_conversations(..., assistant_only=True)`: -100 outside the
assistant's completions, nanochat's loss mask), -100 on padding.

One difference: a conversation longer than a row would never fit in nanochat (it stays in the buffer for good
and the loader emits padding rows around it); here it is cut to the row, as nanochat's renderer cuts at 2048
tokens, and counted (`rows_cut_message`: the run prints one line).

The packing depends only on the conversations' lengths, so the planner (`_BestFit` run on lengths) gives, on
every rank without communication, nanochat's end of epoch (the first micro-batch whose filling has consumed the
whole dataset on some rank) and its schedule progress (rank 0's consumed conversations / dataset size).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset

from ..errors import UserError
from .packing import MicroBatchStream, check_stream_inputs, conversation_lengths

BUFFER_SIZE = 100  # nanochat's buffer_size
IGNORE = -100


def rows_cut_message(token_ds: Dataset, max_seq_len: int) -> str | None:
    """One line about the conversations longer than a row (max_seq_len + 1 tokens), which best-fit packing cuts
    to the row; None when there are none."""
    lengths, cap = conversation_lengths(token_ds), max_seq_len + 1
    cut = np.flatnonzero(lengths > cap)
    if not len(cut):
        return None
    return (
        f"{len(cut)} of {len(lengths)} conversations are longer than a row of max_seq_len+1 = {cap} tokens "
        f"and are cut to it (first: row {int(cut[0])}, {int(lengths[cut[0]])} tokens)"
    )


class _BestFit:
    """nanochat's best-fit state machine on conversation lengths: which conversations make each row.

    State (JSON-able): cursor (next conversation to fetch), consumed (rank + W * conversations placed, nanochat's
    counter), buffer (conversation indices in fetch order), seq (fetches so far: orders equal lengths).
    """

    def __init__(
        self, lengths: np.ndarray, row_capacity: int, rank: int, world_size: int, buffer_size: int = BUFFER_SIZE
    ):
        self.lengths = np.minimum(lengths, row_capacity)  # longer ones are cut to a row
        self.n, self.cap, self.world_size, self.buffer_size = len(lengths), row_capacity, world_size, buffer_size
        self.cursor, self.consumed, self.seq = rank, rank, 0
        self._keys: list[tuple[int, int, int]] = []  # (length, -seq, index), sorted

    def state_dict(self) -> dict:
        order = sorted(self._keys, key=lambda k: -k[1])
        return {
            "cursor": self.cursor,
            "consumed": self.consumed,
            "seq": self.seq,
            "buffer": [int(k[2]) for k in order],
            "buffer_seq": [int(-k[1]) for k in order],
        }

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.consumed, self.seq = state["cursor"], state["consumed"], state["seq"]
        self._keys = sorted((int(self.lengths[i]), -s, i) for i, s in zip(state["buffer"], state["buffer_seq"]))

    def row(self) -> list[int]:
        """Conversation indices of the next row, in placement order (the row is padded after them if short)."""
        placed, room = [], self.cap
        while room > 0:
            while len(self._keys) < self.buffer_size:
                bisect.insort(self._keys, (int(self.lengths[self.cursor]), -self.seq, self.cursor))
                self.seq += 1
                self.cursor = (self.cursor + self.world_size) % self.n
            # the longest that fits; among equal lengths the earliest fetched (largest -seq sorts last)
            i = bisect.bisect_right(self._keys, (room, 1, 0)) - 1
            if i < 0:
                break
            length, _, index = self._keys.pop(i)
            placed.append(index)
            room -= length
            self.consumed += self.world_size
        return placed


class BestFitStream(MicroBatchStream):
    """Micro-batches ``{"input_ids": LongTensor(B, T+1), "labels": LongTensor(B, T+1)}`` (CPU), packed best-fit.

    ``read(count)`` continues from the position (across epochs, as nanochat's cursor wraps); ``state_dict`` /
    ``load_state_dict`` save and restore it (cursor, buffer, micro-batches handed out).
    ``epoch_steps(G)`` and ``lr_progress(step, G)`` are nanochat's end of epoch and schedule progress.
    """

    def __init__(
        self,
        token_ds: Dataset,
        max_seq_len: int,
        device_batch_size: int,
        bos_token_id: int,
        rank: int = 0,
        world_size: int = 1,
        buffer_size: int = BUFFER_SIZE,
    ):
        check_stream_inputs("BestFitStream", token_ds, max_seq_len, device_batch_size, rank, world_size)
        self.ds = token_ds.with_format("arrow")
        self.T, self.B, self.rank, self.world_size = max_seq_len, device_batch_size, rank, world_size
        self.bos = bos_token_id  # nanochat pads rows with BOS (never a target)
        self.cap = max_seq_len + 1
        self._lengths = conversation_lengths(token_ds)
        if self._lengths.min() < 1:
            raise UserError(f"BestFitStream: conversation row {int(np.argmin(self._lengths))} has no tokens")
        self.buffer_size = buffer_size
        self._packer = _BestFit(self._lengths, self.cap, rank, world_size, buffer_size)
        self.micro_batches = 0  # handed out since the start
        self._plans: dict[int, tuple[_BestFit, list[int]]] = {}  # rank -> (planner, consumed after micro-batch m)

    # ---- nanochat's epoch end and schedule progress -----------------------------------------------------
    def _consumed(self, rank: int, m: int) -> int:
        """nanochat's `consumed` on `rank` after its micro-batch m (1-based) was filled."""
        if rank not in self._plans:
            self._plans[rank] = (_BestFit(self._lengths, self.cap, rank, self.world_size, self.buffer_size), [])
        planner, consumed = self._plans[rank]
        while len(consumed) < m:
            for _ in range(self.B):
                planner.row()
            consumed.append(planner.consumed)
        return consumed[m - 1]

    def num_micro_batches(self) -> int:
        """Micro-batches until the first rank has consumed the whole dataset (nanochat's last-step trigger)."""
        n = len(self._lengths)
        counts = []
        for r in range(self.world_size):
            m = 1
            while self._consumed(r, m) < n:
                m += 1
            counts.append(m)
        return min(counts)

    def epoch_steps(self, grad_accum: int) -> int:
        """nanochat draws micro-batch 1 before step 0 and the next one after each backward; the micro-batch M
        that reaches the end of the dataset sets last_step, its step completes and the run stops:
        floor((M - 2) / G) + 1 steps (0 when M = 1)."""
        return (self.num_micro_batches() - 2) // grad_accum + 1

    def lr_progress(self, step: int, grad_accum: int) -> float:
        """Progress of optimizer step `step` (from 0): rank 0's consumed / dataset size after micro-batch
        (step + 1) * G + 1, the last one drawn before nanochat sets the step's LR (it may pass 1.0 at the last
        step, as nanochat's does)."""
        return self._consumed(0, (step + 1) * grad_accum + 1) / len(self._lengths)

    # ---- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "micro_batches": self.micro_batches,
            **self._packer.state_dict(),
            "max_seq_len": self.T,
            "device_batch_size": self.B,
            "rank": self.rank,
            "world_size": self.world_size,
            "conversations": len(self._lengths),
        }

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (
            ("max_seq_len", self.T),
            ("device_batch_size", self.B),
            ("rank", self.rank),
            ("world_size", self.world_size),
            ("conversations", len(self._lengths)),
        ):
            if state.get(key) != mine:
                raise UserError(
                    f"data state does not match this stream: {key}={state.get(key)} in the saved state, "
                    f"{mine} here (same data and batch settings are needed to resume)"
                )
        if not isinstance(state.get("micro_batches"), int) or state["micro_batches"] < 0:
            raise UserError(f"data state: micro_batches={state.get('micro_batches')!r}, expected an integer >= 0")
        self._packer.load_state_dict(state)
        self.micro_batches = state["micro_batches"]

    # ---- reading ----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.read(self.num_micro_batches() - self.micro_batches)

    def read(self, count: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The next `count` micro-batches (None: endless)."""
        made = 0
        while count is None or made < count:
            rows = [self._packer.row() for _ in range(self.B)]
            ids = np.full((self.B, self.cap), self.bos, dtype=np.int64)
            labels = np.full((self.B, self.cap), IGNORE, dtype=np.int64)
            order = np.array([i for row in rows for i in row], dtype=np.int64)
            table = self.ds.data.table.take(pa.array(self._rows_of(order)))
            flat_ids = table["input_ids"].to_pylist()
            flat_labels = table["labels"].to_pylist()
            k = 0
            for b, row in enumerate(rows):
                at = 0
                for _ in row:
                    conv = flat_ids[k][: self.cap]
                    ids[b, at : at + len(conv)] = conv
                    labels[b, at : at + len(conv)] = flat_labels[k][: self.cap]
                    at += len(conv)
                    k += 1
            self.micro_batches += 1
            made += 1
            yield {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}

    def _rows_of(self, indices: np.ndarray) -> np.ndarray:
        """Dataset row numbers of logical indices (a dataset made by select/shuffle has an indices mapping)."""
        mapping = self.ds._indices
        if mapping is None:
            return indices
        return mapping.column(0).to_numpy()[indices]
