"""Pretraining data (`nanochat_hf.data.pretraining`) against nanochat HEAD's loader, executed.

The reference (data/pretrain_reference.json, data/pretrain_tokenizer/) was made by data/make_pretrain_reference.py
(see data/README.md): HEAD's `tokenizing_distributed_data_loader_with_state_bos_bestfit` (rank and world size
emulated) over the synthetic shards `write_synthetic_shards` writes from the stored parameters, with a tokenizer
trained by HEAD's own scripts/tok_train.py on them. Per rank: a sha256 of every micro-batch's rows and the state
dict HEAD yields with it; resumes from a saved rank-0 state, on the same and on other numbers of ranks.
"""

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nanochat_hf.data import pretraining
from nanochat_hf.data.pretraining import (
    PretrainStream,
    default_data_dir,
    find_shards,
    list_shards,
    synthetic_documents,
    write_synthetic_shards,
)
from nanochat_hf.errors import UserError
from nanochat_hf.tokenizer import train_tokenizer
from nanochat_hf.tokenizer.nanochat_format import load_nanochat_tokenizer

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "pretrain_reference.json").read_text())
HEAD_KEYS = ("pq_idx", "rg_idx", "epoch")


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    """The reference's shards, written again from its parameters (and checked to hold the same texts)."""
    params = {k: v for k, v in REFERENCE["shards"].items() if k != "texts_sha256"}
    folder = tmp_path_factory.mktemp("base") / "base_data_climbmix"
    write_synthetic_shards(folder, **params)
    texts = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        for doc in pq.read_table(path)["text"].to_pylist():
            texts.update(doc.encode() + b"\0")
    assert texts.hexdigest() == REFERENCE["shards"]["texts_sha256"], "the synthetic shards differ from the reference's"
    return folder


@pytest.fixture(scope="module")
def head_tokenizer():
    return load_nanochat_tokenizer(DATA / "pretrain_tokenizer", trust_pickle=True)


def stream(tok, shard_dir, case: dict, rank: int, world_size: int, split: str | None = None) -> PretrainStream:
    return PretrainStream(
        tok,
        case["B"],
        case["T"],
        split=split or case["split"],
        rank=rank,
        world_size=world_size,
        shards=list_shards(shard_dir),
        buffer_size=case["buffer_size"],
        tokenizer_batch_size=case["tokenizer_batch_size"],
    )


def rows_sha(batch) -> str:
    return hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]


def check_rank(s: PretrainStream, expected: dict, bos: int) -> None:
    """Micro-batch by micro-batch: the state a checkpoint would save before it (HEAD's, yielded with it: HEAD
    prefetches) and its rows."""
    for i, (sha, state) in enumerate(zip(expected["sha"], expected["state"])):
        assert {k: s.state_dict()[k] for k in HEAD_KEYS} == state, f"state before micro-batch {i}"
        (batch,) = s.read(1)
        if i == 0:
            assert batch["input_ids"][0, :24].tolist() == expected["first_row_head"]
        assert rows_sha(batch) == sha, f"micro-batch {i}"
        assert batch["input_ids"].shape == batch["labels"].shape and batch["labels"].equal(batch["input_ids"])
        assert (batch["input_ids"][:, 0] == bos).all()  # BOS-aligned rows


@pytest.mark.parametrize("name", list(REFERENCE["cases"]))
def test_rows_equal_heads(name, shard_dir, head_tokenizer):
    case = REFERENCE["cases"][name]
    for rank, expected in enumerate(case["ranks"]):
        check_rank(stream(head_tokenizer, shard_dir, case, rank, case["W"]), expected, head_tokenizer.bos_token_id)


@pytest.mark.parametrize("name", list(REFERENCE["resumes"]))
def test_resume_equals_heads(name, shard_dir, head_tokenizer):
    """A state our rank 0 saved (HEAD's keys and fingerprints), loaded on W' ranks, gives HEAD's resumed rows; so
    does HEAD's own state (a nanochat checkpoint's meta: its three keys only)."""
    resume = REFERENCE["resumes"][name]
    case = REFERENCE["cases"][resume["of"]]
    first = stream(head_tokenizer, shard_dir, case, 0, case["W"])
    for _ in first.read(resume["after"]):
        pass
    saved = first.state_dict()
    assert {k: saved[k] for k in HEAD_KEYS} == resume["saved_state"]
    saved = json.loads(json.dumps(saved))  # as a checkpoint stores it
    for rank, expected in enumerate(resume["ranks"]):
        s = stream(head_tokenizer, shard_dir, case, rank, resume["W"], split="train")
        s.load_state_dict(saved if rank % 2 == 0 else resume["saved_state"])
        check_rank(s, expected, head_tokenizer.bos_token_id)


def test_mismatched_resume_is_one_line(shard_dir, head_tokenizer, tmp_path):
    case = REFERENCE["cases"]["w2"]
    saved = stream(head_tokenizer, shard_dir, case, 0, 2).state_dict()
    # other shards: the first three only (the third becomes the validation shard)
    other = tmp_path / "other"
    other.mkdir()
    for path in sorted(shard_dir.iterdir())[:3]:
        (other / path.name).write_bytes(path.read_bytes())
    s = stream(head_tokenizer, other, case, 0, 2)
    with pytest.raises(UserError, match=r"^data state belongs to other shards: saved for 3 train shards") as e:
        s.load_state_dict(saved)
    assert "\n" not in str(e.value) and str(other) in str(e.value)
    # another tokenizer of the same size
    other_tokenizer = train_tokenizer(synthetic_documents(300, seed=9), len(head_tokenizer))
    assert len(other_tokenizer) == len(head_tokenizer)
    s = stream(other_tokenizer, shard_dir, case, 0, 2)
    with pytest.raises(UserError, match=r"^data state belongs to another tokenizer \(vocabulary fingerprint"):
        s.load_state_dict(saved)
    # another split, a position that is not one
    s = stream(head_tokenizer, shard_dir, case, 0, 2, split="val")
    with pytest.raises(UserError, match=r"^data state is of the 'train' split, this stream reads 'val'$"):
        s.load_state_dict(saved)
    s = stream(head_tokenizer, shard_dir, case, 0, 2)
    with pytest.raises(UserError, match=r"^data state: rg_idx='3', expected an integer >= 0$"):
        s.load_state_dict({**saved, "rg_idx": "3"})
    with pytest.raises(UserError, match=r"^data state: pq_idx=7, but the train split has 3 shards$"):
        s.load_state_dict({**saved, "pq_idx": 7})


def test_same_tokenizer_saved_by_transformers_resumes(shard_dir, head_tokenizer, tmp_path):
    """HEAD's tokenizer.pkl and the Hugging Face files of the same tokenizer (what a run saves) are one tokenizer:
    a state saved with one resumes with the other, to the same rows."""
    from transformers import PreTrainedTokenizerFast

    head_tokenizer.save_pretrained(tmp_path)
    hf_tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    case = REFERENCE["cases"]["w2"]
    first = stream(head_tokenizer, shard_dir, case, 0, 2)
    next(first.read(1))
    s = stream(hf_tokenizer, shard_dir, case, 0, 2)
    s.load_state_dict(first.state_dict())
    resumed = stream(head_tokenizer, shard_dir, case, 0, 2)
    resumed.load_state_dict(first.state_dict())
    assert next(s.read(1))["input_ids"].equal(next(resumed.read(1))["input_ids"])


def test_bad_shard_folders_are_one_line(tmp_path, head_tokenizer):
    with pytest.raises(UserError, match=r"missing: no such shard folder \(download shards with nanochat's"):
        list_shards(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "shard_00000.parquet.tmp").write_bytes(b"partial download")  # HEAD's temporaries are not shards
    with pytest.raises(UserError, match=r"empty: no \*\.parquet shards in the folder \(download shards with"):
        list_shards(empty)
    bad = tmp_path / "bad"
    write_synthetic_shards(bad, 2, 10, row_group_size=4)
    (bad / "shard_00001.parquet").write_text("not parquet at all")
    with pytest.raises(UserError, match=r"shard_00001\.parquet: not a readable parquet file \(") as e:
        list_shards(bad)
    assert "\n" not in str(e.value)
    pq.write_table(pa.table({"content": ["a doc"], "id": [1]}), bad / "shard_00001.parquet")
    with pytest.raises(
        UserError,
        match=r"shard_00001\.parquet: expected a string column 'text' \(one document per row\), found columns "
        r"content \(string\), id \(int64\)$",
    ):
        list_shards(bad)
    pq.write_table(pa.table({"text": [1, 2]}), bad / "shard_00001.parquet")
    with pytest.raises(UserError, match=r"expected a string column 'text'.*found columns text \(int64\)$"):
        list_shards(bad)
    one = tmp_path / "one"
    write_synthetic_shards(one, 1, 10)
    with pytest.raises(UserError, match=r"one: 1 shard, at least 2 are needed \(the last one is the validation"):
        PretrainStream(head_tokenizer, 1, 8, shards=list_shards(one))


def test_default_folder_and_offline(tmp_path, monkeypatch):
    """HEAD's folders under $NANOCHAT_BASE_DIR; offline with no shards: one line naming the folder."""
    from huggingface_hub import constants

    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=rf"^{tmp_path}/base_data_climbmix: no such shard folder \(download shards"):
        find_shards()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert find_shards() == pretraining.hub_shards()  # online, no local folder: the hub dataset, streamed
    assert find_shards()[-1] == "hf://datasets/karpathy/climbmix-400b-shuffle/shard_06542.parquet"
    write_synthetic_shards(tmp_path / "base_data", 2, 5)  # HEAD's legacy folder, read when the new one is absent
    assert default_data_dir() == tmp_path / "base_data"
    assert [Path(p).name for p in find_shards()] == ["shard_00000.parquet", "shard_00001.parquet"]
    write_synthetic_shards(tmp_path / "base_data_climbmix", 3, 5)
    assert default_data_dir() == tmp_path / "base_data_climbmix" and len(find_shards()) == 3


@pytest.mark.timeout(60)  # HEAD's loop never ends here: a regression hangs
def test_rank_without_row_groups_is_one_line(tmp_path, head_tokenizer):
    """HEAD's loader would wait forever for a rank whose stride holds no row group."""
    write_synthetic_shards(tmp_path, 3, 6, row_group_size=4)  # 2 row groups per shard
    s = PretrainStream(head_tokenizer, 1, 16, rank=2, world_size=3, shards=list_shards(tmp_path))
    with pytest.raises(UserError, match=r"^rank 2 of 3 reads no row group of the 2 shard\(s\) from shard_00000"):
        next(s.read(1))


def test_synthetic_shards_layout(tmp_path):
    """nanochat's layout: shard_NNNNN.parquet, a text column, row groups of the given size, HEAD's writer options."""
    paths = write_synthetic_shards(tmp_path, 2, 10, seed=3, row_group_size=4)
    assert [p.name for p in paths] == ["shard_00000.parquet", "shard_00001.parquet"]
    meta = pq.ParquetFile(paths[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 2]
    assert meta.row_group(0).column(0).compression == "ZSTD" and meta.schema.names == ["text"]
    assert pq.read_table(paths[1])["text"].to_pylist() == synthetic_documents(10, 3 * 1_000_003 + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_00000.parquet", "shard_00001.parquet"]
