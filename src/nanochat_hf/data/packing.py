"""Packing tokenized conversations into nanochat's micro-batches, each rank reading its own share."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset


class PackedStream:
    """Iterable of micro-batches ``{"input_ids": LongTensor(B, T+1), "labels": LongTensor(B, T+1)}`` (CPU).

    Rank ``r`` of ``W`` appends conversations r, r+W, r+2W, ... to one running token stream. As in nanochat,
    a micro-batch is the next ``B*T + 1`` tokens of that stream; row b is tokens ``[b*T, b*T + T + 1)`` of
    the micro-batch, so consecutive rows share one token (row b's last input token's target is row b+1's
    first token) and the model's shift gives nanochat's (B, T) inputs/targets exactly. No padding; documents
    cross row and batch boundaries.

    An epoch is ``num_micro_batches()`` micro-batches: the number of whole micro-batches the SMALLEST rank
    share holds, computed on every rank from the lengths of all conversations (no communication), so every
    rank stops at the same step. Iterating yields the rest of the current epoch; iterating again after the
    epoch ended starts the next one (the same stream again). ``state_dict()`` records the position after the
    last micro-batch handed out; ``load_state_dict()`` resumes there (restart iteration afterwards).
    Do not iterate it from DataLoader worker processes (the position lives in this object).
    """

    def __init__(self, token_ds: Dataset, max_seq_len: int, device_batch_size: int, rank: int = 0,
                 world_size: int = 1, chunk_size: int = 1024):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if max_seq_len < 1 or device_batch_size < 1:
            raise ValueError(f"max_seq_len and device_batch_size must be >= 1, "
                             f"got {max_seq_len} and {device_batch_size}")
        missing = {"input_ids", "labels"} - set(token_ds.column_names)
        if missing:
            raise ValueError(f"PackedStream needs a tokenized dataset (tokenize_conversations): "
                             f"no column {', '.join(sorted(missing))}")
        self.ds = token_ds.with_format("arrow")
        self.T, self.B, self.rank, self.world_size = max_seq_len, device_batch_size, rank, world_size
        self.chunk_size = chunk_size
        self.tokens_per_batch = device_batch_size * max_seq_len + 1
        if "num_tokens" in token_ds.column_names:
            lengths = np.asarray(self.ds["num_tokens"], dtype=np.int64)
        else:
            lengths = pc.list_value_length(self.ds["input_ids"]).to_numpy().astype(np.int64)
        shares = [int(lengths[r::world_size].sum()) for r in range(world_size)]
        self._num = min(shares) // self.tokens_per_batch
        self._cum = np.cumsum(lengths[rank::world_size])  # tokens of this rank's share up to each conversation
        self.tokens_per_rank = shares
        self.epoch, self.micro_batches = 0, 0

    def num_micro_batches(self) -> int:
        """Micro-batches in one epoch: the same on every rank."""
        return self._num

    def __len__(self) -> int:
        return self._num

    @property
    def progress(self) -> float:
        """Fraction of the current epoch handed out (0..1)."""
        return self.micro_batches / self._num if self._num else 1.0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "micro_batches": self.micro_batches, "max_seq_len": self.T,
                "device_batch_size": self.B, "rank": self.rank, "world_size": self.world_size,
                "num_micro_batches": self._num}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("max_seq_len", self.T), ("device_batch_size", self.B), ("rank", self.rank),
                          ("world_size", self.world_size), ("num_micro_batches", self._num)):
            if key in state and state[key] != mine:
                raise ValueError(f"data state does not match this stream: {key}={state[key]} in the saved state, "
                                 f"{mine} here (same data and batch settings are needed to resume)")
        if not 0 <= state["micro_batches"] <= self._num:
            raise ValueError(f"data state: micro_batches={state['micro_batches']} outside [0, {self._num}]")
        self.epoch, self.micro_batches = int(state["epoch"]), int(state["micro_batches"])

    def reset(self) -> None:
        """Back to the start of epoch 0 (e.g. for a validation stream read from the start at every eval)."""
        self.epoch, self.micro_batches = 0, 0

    def _conversations(self, first: int):
        """(input_ids, labels) numpy arrays of this rank's conversations from share index `first` on, in chunks."""
        n_share = len(self._cum)
        W = self.world_size
        for k in range(first, n_share, self.chunk_size):
            stop = min(k + self.chunk_size, n_share)
            lo, hi = self.rank + k * W, self.rank + (stop - 1) * W + 1
            table = self.ds[lo:hi]
            if W > 1:
                table = table.take(pa.array(range(0, hi - lo, W)))
            yield (pc.list_flatten(table["input_ids"]).to_numpy().astype(np.int64),
                   pc.list_flatten(table["labels"]).to_numpy().astype(np.int64))

    def __iter__(self):
        if self.micro_batches >= self._num and self._num > 0:
            self.epoch, self.micro_batches = self.epoch + 1, 0
        consumed = self.micro_batches * self.tokens_per_batch
        first = int(np.searchsorted(self._cum, consumed, side="right"))  # conversation holding the next token
        skip = consumed - (int(self._cum[first - 1]) if first else 0)
        ids_buf, lab_buf = np.empty(0, np.int64), np.empty(0, np.int64)
        chunks = self._conversations(first)
        n = self.tokens_per_batch
        while self.micro_batches < self._num:
            while len(ids_buf) < n:
                ids, labels = next(chunks)
                ids_buf, lab_buf = np.concatenate([ids_buf, ids[skip:]]), np.concatenate([lab_buf, labels[skip:]])
                skip = 0
            batch = {"input_ids": self._rows(ids_buf[:n]), "labels": self._rows(lab_buf[:n])}
            ids_buf, lab_buf = ids_buf[n:], lab_buf[n:]
            self.micro_batches += 1
            yield batch

    def _rows(self, flat: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(flat).unfold(0, self.T + 1, self.T).contiguous()
