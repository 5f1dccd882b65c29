"""nanochat HEAD's pretraining data (nanochat/dataset.py and nanochat/dataloader.py at 92d63d4) on `datasets`.

- Shards: parquet files ``shard_NNNNN.parquet`` with a ``text`` column, in ``$NANOCHAT_BASE_DIR/base_data_climbmix``
  (HEAD's folder; ``base_data``, its FinewebEdu folder, when that one does not exist), sorted by name; the LAST
  shard is the validation split, the others the train split (`list_shards`, `split_shards`). Without a local
  folder and with the hub reachable (``HF_HUB_OFFLINE`` unset), the hub dataset ``karpathy/climbmix-400b-shuffle``
  is streamed instead (`find_shards`; untested here: the test machines have no network).
- Documents (`document_batches`): read with `datasets` (a streaming parquet dataset per shard, split into its row
  groups with ``reshard()``), in HEAD's order: rank r of W reads row groups r, r+W, r+2W, ... of each shard, in
  batches of 128 documents, endlessly, counting epochs from 1.
- Rows (`PretrainStream`): every document tokenized with a BOS in front (the fast tokenizer, special-token
  strings in the text read as plain text as tiktoken's ``encode_ordinary``), packed by HEAD's BOS-aligned best
  fit: a buffer of at least 1000 documents; each row of T+1 tokens takes the LARGEST buffered document that fits
  whole (the earliest buffered among equals) until none fits, then the SHORTEST one (again the earliest) cropped
  to fill the row exactly. No padding; every row starts with a BOS.
- State: HEAD's ``{"pq_idx", "rg_idx", "epoch"}`` (where the last refill of the buffer read), plus fingerprints
  of the shards and the tokenizer so that a resume onto other data is refused. A resume skips to the next round
  of row groups and starts with an empty buffer, exactly as HEAD's loader does.
- `write_synthetic_shards`: offline shards in this layout (english words), for the tests and the demo.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ..atomic import replacing
from ..errors import UserError
from ..paths import nanochat_base_dir
from .packing import MicroBatchStream

DATA_SUBDIR = "base_data_climbmix"  # HEAD's folder under $NANOCHAT_BASE_DIR
LEGACY_SUBDIR = "base_data"  # HEAD's FinewebEdu-100B folder, read when DATA_SUBDIR does not exist
HUB_DATASET = "karpathy/climbmix-400b-shuffle"
HUB_LAST_SHARD = 6542  # HEAD's MAX_SHARD: shard_06542.parquet, the validation shard
TEXT_COLUMN = "text"
ROW_GROUP_SIZE = 1024  # dev/repackage_data_reference.py
TOKENIZER_BATCH_SIZE = 128  # HEAD's tokenizer_batch_size
BUFFER_SIZE = 1000  # HEAD's buffer_size
GET_SHARDS = (
    f"download shards with nanochat's `python -m nanochat.dataset -n N` (hub dataset {HUB_DATASET}), "
    "or write synthetic ones with nanochat_hf.data.pretraining.write_synthetic_shards"
)


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.parquet"


def default_data_dir() -> Path:
    """HEAD's shard folder: ``$NANOCHAT_BASE_DIR/base_data_climbmix``, else (when it does not exist and the legacy
    one does) ``$NANOCHAT_BASE_DIR/base_data``."""
    base = nanochat_base_dir()
    folder = base / DATA_SUBDIR
    if not folder.exists() and (base / LEGACY_SUBDIR).is_dir():
        return base / LEGACY_SUBDIR
    return folder


def list_shards(data_dir: str | os.PathLike | None = None) -> list[str]:
    """The parquet shards of `data_dir` (default: `default_data_dir()`), sorted by name as HEAD lists them, each
    checked to be parquet with a ``text`` column. One-line `UserError` for a missing or empty folder and for a bad
    shard."""
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    if not folder.is_dir():
        raise UserError(f"{folder}: no such shard folder ({GET_SHARDS})")
    shards = sorted(folder / f for f in os.listdir(folder) if f.endswith(".parquet"))
    if not shards:
        raise UserError(f"{folder}: no *.parquet shards in the folder ({GET_SHARDS})")
    for path in shards:
        check_shard(path)
    return [str(p) for p in shards]


def check_shard(path: str | os.PathLike) -> None:
    """One-line `UserError` unless `path` is a parquet file with a string ``text`` column."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable parquet file ({' '.join(str(e).split())})") from None
    field = schema.field(TEXT_COLUMN) if TEXT_COLUMN in schema.names else None
    if field is None or not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        raise UserError(
            f"{path}: expected a string column {TEXT_COLUMN!r} (one document per row), found columns "
            f"{', '.join(f'{f.name} ({f.type})' for f in schema) or 'none'}"
        )


def hub_shards() -> list[str]:
    """HEAD's shards of the hub dataset, as `datasets` reads them (``hf://`` paths): shard_00000 .. shard_06542."""
    return [f"hf://datasets/{HUB_DATASET}/{shard_name(i)}" for i in range(HUB_LAST_SHARD + 1)]


def find_shards(data_dir: str | os.PathLike | None = None) -> list[str]:
    """`list_shards(data_dir)`; with no `data_dir`, no local folder and the hub reachable (``HF_HUB_OFFLINE``
    unset), the hub dataset's shards, streamed (no network here: that path is not exercised by the tests)."""
    from huggingface_hub import constants

    if data_dir is None and not default_data_dir().exists() and not constants.HF_HUB_OFFLINE:
        return hub_shards()
    return list_shards(data_dir)


def split_shards(shards: list[str], split: str) -> list[str]:
    """HEAD's split: the last shard is validation, the others train."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if len(shards) < 2:
        where = Path(shards[0]).parent if shards else "the shard folder"
        raise UserError(f"{where}: {len(shards)} shard, at least 2 are needed (the last one is the validation split)")
    return shards[:-1] if split == "train" else shards[-1:]


def shards_fingerprint(shards: list[str]) -> str:
    """Which shards a stream reads: a hash of their names, in order (a resume checks it)."""
    return hashlib.sha256("\0".join(Path(s).name for s in shards).encode()).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    """Which tokenizer made the rows: a hash of its vocabulary (token -> id, special tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


# ---- documents ---------------------------------------------------------------------------------------------


def _row_groups(path: str):
    """The shard as a streaming `datasets.IterableDataset` of its ``text`` column, one data shard per parquet row
    group (``reshard``): ``.shard(n, i, contiguous=True)`` is row group i."""
    import datasets

    ds = datasets.load_dataset("parquet", data_files=[path], split="train", streaming=True, columns=[TEXT_COLUMN])
    return ds.reshard()


def document_batches(
    shards: list[str],
    rank: int = 0,
    world_size: int = 1,
    resume: dict | None = None,
    batch_size: int = TOKENIZER_BATCH_SIZE,
) -> Iterator[tuple[list[str], tuple[int, int, int]]]:
    """HEAD's `_document_batches` over `shards` (one split's): endless ``(documents, (pq_idx, rg_idx, epoch))``,
    rank `rank` of `world_size` reading row groups rank, rank+W, ... of each shard in batches of `batch_size`.
    `resume` (HEAD's state dict): start at the next round of row groups after its ``rg_idx`` in shard ``pq_idx``."""
    resume_pq = resume["pq_idx"] if resume is not None else 0
    resume_rg = resume["rg_idx"] if resume is not None else None
    epoch = resume.get("epoch", 1) if resume is not None else 1
    first_pass = True
    while True:  # one epoch per pass
        pq_idx = resume_pq if first_pass else 0
        read_any = False
        while pq_idx < len(shards):
            groups = _row_groups(shards[pq_idx])
            n = groups.num_shards
            if first_pass and resume_rg is not None and pq_idx == resume_pq:
                rg_idx = (resume_rg // world_size + 1) * world_size + rank  # the next round: no repeated data
                if rg_idx >= n:
                    pq_idx += 1
                    continue
                resume_rg = None
            else:
                rg_idx = rank
            while rg_idx < n:
                read_any = True
                # the whole row group first (as HEAD reads it), so no parquet reader stays open between yields
                group = list(groups.shard(n, rg_idx, contiguous=True).with_format("arrow").iter(batch_size))
                for table in group:
                    yield table[TEXT_COLUMN].to_pylist(), (pq_idx, rg_idx, epoch)
                rg_idx += world_size
            pq_idx += 1
        if not read_any and not first_pass:
            raise UserError(
                f"rank {rank} of {world_size} reads no row group of the {len(shards)} shard(s) from "
                f"{Path(shards[0]).name}: they have fewer than {rank + 1} row groups each (use fewer processes "
                "or shards with more row groups)"
            )
        first_pass = False
        epoch += 1


# ---- rows --------------------------------------------------------------------------------------------------


def ordinary_encoder(tokenizer):
    """The tokenizer's Rust backend reading special-token strings as plain text (tiktoken's ``encode_ordinary``),
    without post-processing: ``encode_batch_fast`` is parallel in Rust."""
    from ..tokenizer.chat import _renderer

    return _renderer(tokenizer)[0]


class PretrainStream(MicroBatchStream):
    """Micro-batches ``{"input_ids": LongTensor(B, T+1), "labels": LongTensor(B, T+1)}`` (CPU) of HEAD's pretraining
    loader (`tokenizing_distributed_data_loader_with_state_bos_bestfit`) for rank `rank` of `world_size`.

    Each row is HEAD's ``row_buffer`` row: HEAD's inputs are ``row[:-1]`` and targets ``row[1:]``, which is what the
    model's shift of ``labels`` (equal to ``input_ids``: every token is a target) gives. The stream is endless
    (epochs wrap around the shards): the run's length comes from its own settings (``num_iterations``, ...), so
    `num_micro_batches`, `epoch_steps` and `lr_progress` are not defined for it.

    `state_dict()` is what HEAD's base_train saves at this point of a run: HEAD draws each micro-batch one ahead
    (the prefetch after each backward) and saves the position yielded with it, so the state is the position after
    filling the NEXT micro-batch (built now and handed out by the next `read`). Its keys: HEAD's ``pq_idx``,
    ``rg_idx``, ``epoch``, and ``split``, ``shards``, ``num_shards``, ``tokenizer`` (fingerprints), ``rank``,
    ``world_size`` (who saved it). `load_state_dict(state)` accepts a state saved by ANY rank of ANY number of
    processes (and HEAD's own three keys, from a nanochat checkpoint's meta): this stream continues as HEAD's loader
    of rank `rank` of `world_size` does when given it as ``resume_state_dict`` (the next round of row groups, an
    empty buffer). HEAD resumes every rank from rank 0's state (only rank 0 writes the checkpoint's meta).
    """

    def __init__(
        self,
        tokenizer,
        device_batch_size: int,
        max_seq_len: int,
        split: str = "train",
        rank: int = 0,
        world_size: int = 1,
        data_dir: str | os.PathLike | None = None,
        shards: list[str] | None = None,
        buffer_size: int = BUFFER_SIZE,
        tokenizer_batch_size: int = TOKENIZER_BATCH_SIZE,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if max_seq_len < 1 or device_batch_size < 1:
            raise UserError(
                f"max_seq_len and device_batch_size must be >= 1, got {max_seq_len} and {device_batch_size}"
            )
        self.shards = split_shards(find_shards(data_dir) if shards is None else list(shards), split)
        self.split, self.rank, self.world_size = split, rank, world_size
        self.B, self.T, self.cap = device_batch_size, max_seq_len, max_seq_len + 1
        self.buffer_size, self.tokenizer_batch_size = buffer_size, tokenizer_batch_size
        self.bos = tokenizer.bos_token_id
        self.encoder = ordinary_encoder(tokenizer)
        self.fingerprints = {"shards": shards_fingerprint(self.shards), "tokenizer": tokenizer_fingerprint(tokenizer)}
        self._start(None)

    def _start(self, resume: dict | None) -> None:
        self._batches = document_batches(self.shards, self.rank, self.world_size, resume, self.tokenizer_batch_size)
        self._docs: dict[int, list[int]] = {}  # buffered documents by arrival number
        self._keys: list[tuple[int, int]] = []  # (length, -arrival), sorted
        self._arrivals = 0
        self._position = (0, 0, 1)  # (pq_idx, rg_idx, epoch) of the last refill, HEAD's initial values
        self._next: tuple[dict[str, torch.Tensor], tuple[int, int, int]] | None = None
        self.micro_batches = 0  # handed out since the start (or the resume)

    # ---- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self._next is None:
            self._next = self._build()
        pq_idx, rg_idx, epoch = self._next[1]
        return {
            "pq_idx": pq_idx,
            "rg_idx": rg_idx,
            "epoch": epoch,
            "split": self.split,
            "num_shards": len(self.shards),
            **self.fingerprints,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("pq_idx", "rg_idx", "epoch"):
            if not isinstance(state.get(key), int) or state[key] < (1 if key == "epoch" else 0):
                raise UserError(f"data state: {key}={state.get(key)!r}, expected an integer >= {int(key == 'epoch')}")
        if state.get("split", self.split) != self.split:
            raise UserError(f"data state is of the {state['split']!r} split, this stream reads {self.split!r}")
        if state.get("shards", self.fingerprints["shards"]) != self.fingerprints["shards"]:
            raise UserError(
                f"data state belongs to other shards: saved for {state.get('num_shards')} {self.split} shards "
                f"(fingerprint {state['shards']}), this run reads {len(self.shards)} from "
                f"{Path(self.shards[0]).parent} (fingerprint {self.fingerprints['shards']}): "
                "resume with the same shards"
            )
        if state.get("tokenizer", self.fingerprints["tokenizer"]) != self.fingerprints["tokenizer"]:
            raise UserError(
                f"data state belongs to another tokenizer (vocabulary fingerprint {state['tokenizer']}, this run's "
                f"{self.fingerprints['tokenizer']}): resume with the tokenizer the run started with"
            )
        if state["pq_idx"] >= len(self.shards):
            raise UserError(
                f"data state: pq_idx={state['pq_idx']}, but the {self.split} split has {len(self.shards)} shards"
            )
        self._start({"pq_idx": state["pq_idx"], "rg_idx": state["rg_idx"], "epoch": state["epoch"]})

    # ---- the protocol's epoch-based parts: not defined for an endless stream ------------------------------
    def num_micro_batches(self) -> int:
        raise NotImplementedError("PretrainStream is endless: the run's length comes from num_iterations")

    def epoch_steps(self, grad_accum: int) -> int:
        raise NotImplementedError("PretrainStream is endless: the run's length comes from num_iterations")

    def lr_progress(self, step: int, grad_accum: int) -> float:
        raise NotImplementedError("PretrainStream is endless: the schedule's progress is step / num_iterations")

    # ---- reading ----------------------------------------------------------------------------------------
    def read(self, count: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The next `count` micro-batches (None: endless)."""
        made = 0
        while count is None or made < count:
            batch, _ = self._next if self._next is not None else self._build()
            self._next = None
            self.micro_batches += 1
            made += 1
            yield batch

    def _refill(self) -> None:
        """HEAD's refill_buffer: the next batch of documents, each tokenized with a BOS in front."""
        docs, self._position = next(self._batches)
        for enc in self.encoder.encode_batch_fast(docs, add_special_tokens=False):
            ids = [self.bos, *enc.ids]
            self._docs[self._arrivals] = ids
            bisect.insort(self._keys, (len(ids), -self._arrivals))
            self._arrivals += 1

    def _take(self, i: int) -> list[int]:
        _, neg = self._keys.pop(i)
        return self._docs.pop(-neg)

    def _build(self) -> tuple[dict[str, torch.Tensor], tuple[int, int, int]]:
        """The next micro-batch and the position HEAD yields with it."""
        rows = np.empty((self.B, self.cap), dtype=np.int64)
        for row in rows:
            pos = 0
            while pos < self.cap:
                while len(self._keys) < self.buffer_size:
                    self._refill()
                remaining = self.cap - pos
                # the largest that fits whole, the earliest buffered among equals (largest -arrival sorts last)
                i = bisect.bisect_right(self._keys, (remaining, 1)) - 1
                if i >= 0:
                    doc = self._take(i)
                    row[pos : pos + len(doc)] = doc
                    pos += len(doc)
                else:  # none fits: crop the shortest (the earliest buffered among equals) to fill the row
                    shortest = self._keys[0][0]
                    doc = self._take(bisect.bisect_right(self._keys, (shortest, 1)) - 1)
                    row[pos:] = doc[:remaining]
                    pos = self.cap
        ids = torch.from_numpy(rows)
        return {"input_ids": ids, "labels": ids.clone()}, self._position


# ---- synthetic shards ----------------------------------------------------------------------------------------


def synthetic_documents(count: int, seed: int = 0) -> list[str]:
    """`count` documents of english words (the english-words package: no download), a few sentences to several
    paragraphs each, some with digits, non-ASCII text or nanochat's special-token strings (which must be read as
    plain text). Deterministic for a given seed."""
    from .words import english_words

    words = english_words()
    rng = random.Random(seed)
    extras = ["1984", "3.14", "2,048", "café", "naïve", "日本語", "emoji 🙂", "<|bos|>", "<|user_start|>", "\t", "\n\n"]
    docs = []
    for _ in range(count):
        sentences = []
        for _ in range(max(1, int(rng.lognormvariate(1.2, 1.0)))):
            sentence = [rng.choice(words) for _ in range(rng.randint(3, 14))]
            if rng.random() < 0.3:
                sentence.insert(rng.randrange(len(sentence) + 1), rng.choice(extras))
            sentences.append(" ".join(sentence).capitalize() + rng.choice(".!?"))
        docs.append(" ".join(sentences))
    return docs


def write_synthetic_shards(
    out_dir: str | os.PathLike,
    num_shards: int,
    docs_per_shard: int,
    seed: int = 0,
    row_group_size: int = ROW_GROUP_SIZE,
) -> list[Path]:
    """Write `num_shards` shards of `synthetic_documents` in nanochat's layout (``shard_00000.parquet``, ...; a
    ``text`` column; `row_group_size` documents per row group, zstd level 3, no dictionary, no statistics, as HEAD's
    dev/repackage_data_reference.py writes them), each file atomically. Shard i's documents come from seed
    ``seed * 1_000_003 + i``. The last shard is the validation split."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(num_shards):
        path = out / shard_name(i)
        table = pa.Table.from_pydict({TEXT_COLUMN: synthetic_documents(docs_per_shard, seed * 1_000_003 + i)})
        with replacing(path) as tmp:
            pq.write_table(
                table,
                tmp,
                row_group_size=row_group_size,
                use_dictionary=False,
                compression="zstd",
                compression_level=3,
                write_statistics=False,
            )
        paths.append(path)
    return paths
