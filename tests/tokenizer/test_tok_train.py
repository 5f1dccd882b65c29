"""scripts/tok_train.py against nanochat HEAD's tok_train.py executed on the same shards (data/tok_train_92d63d4,
made by data/make_tok_train_reference.py): same vocabulary and merges, same tokenizer.pkl and token_bytes.pt bytes,
held-out text encoded token for token alike; the folder loads without unpickling; bad input is one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from nanochat_hf.tokenizer import to_mergeable_ranks
from nanochat_hf.tokenizer.nanochat_format import load_tokenizer_dir, read_tiktoken_pickle
from nanochat_hf.tokenizer.training import capped_documents, train_bpe

DATA = Path(__file__).parent / "data" / "tok_train_92d63d4"
REFERENCE = json.loads((DATA / "heldout.json").read_text())
FLAGS = dict(zip(REFERENCE["args"][::2], map(int, REFERENCE["args"][1::2])))  # HEAD's --vocab-size 1024 ...
ROOT = Path(__file__).resolve().parents[2]


def tok_train(*argv: str) -> int:
    import runpy

    main = runpy.run_path(str(ROOT / "scripts" / "tok_train.py"))["main"]
    return main(list(argv))


def head_flags(output_dir: Path, data_dir: Path = DATA / "shards") -> list[str]:
    return [*REFERENCE["args"], "--data_dir", str(data_dir), "--output_dir", str(output_dir)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    assert tok_train(*head_flags(out)) == 0
    return out


def test_same_files_as_head(trained):
    for name in ("tokenizer.pkl", "token_bytes.pt"):
        assert (trained / name).read_bytes() == (DATA / name).read_bytes(), name


def test_same_vocabulary_merges_and_encodings_as_head(trained):
    head = read_tiktoken_pickle(DATA / "tokenizer.pkl")
    ours = load_tokenizer_dir(trained)  # the Hugging Face files: nothing unpickled
    ranks, specials = to_mergeable_ranks(ours)
    assert len(ours) == FLAGS["--vocab-size"]
    assert ranks == head["mergeable_ranks"] and specials == head["special_tokens"]
    for text, ids in zip(REFERENCE["texts"], REFERENCE["ids"]):
        assert ours.encode(text, add_special_tokens=False) == ids
        assert ours.decode(ids) == text
    heads_counts = torch.load(DATA / "token_bytes.pt", weights_only=True)
    assert ours.init_kwargs["token_bytes_convention"] == "raw"
    assert torch.equal(heads_counts, torch.load(trained / "token_bytes.pt", weights_only=True))


def test_auto_tokenizer_with_chat_template(trained):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained)
    assert tok.encode(REFERENCE["texts"][0], add_special_tokens=False) == REFERENCE["ids"][0]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids = tok.apply_chat_template(chat, return_dict=True)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[:2] == ["<|bos|>", "<|user_start|>"]
    assert tok.convert_ids_to_tokens(ids)[-1] == "<|assistant_end|>"


def test_loader_reads_hf_files_without_pickle_and_a_head_folder_only_when_trusted(trained, tmp_path, monkeypatch):
    from nanochat_hf.tokenizer import nanochat_format

    def no_pickle(path):
        raise AssertionError(f"unpickled {path}")

    monkeypatch.setattr(nanochat_format, "read_tiktoken_pickle", no_pickle)
    assert len(load_tokenizer_dir(trained)) == FLAGS["--vocab-size"]
    monkeypatch.undo()
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    for name in ("tokenizer.pkl", "token_bytes.pt"):
        shutil.copyfile(DATA / name, head_dir / name)
    with pytest.raises(ValueError, match="is a pickle"):
        load_tokenizer_dir(head_dir)
    head = load_tokenizer_dir(head_dir, trust_pickle=True)
    assert head.encode(REFERENCE["texts"][-1], add_special_tokens=False) == REFERENCE["ids"][-1]


def test_a_stale_tokenizer_json_is_refused(trained, tmp_path):
    # nanochat's tok_train.py rerun into our folder with another vocab rewrites tokenizer.pkl and token_bytes.pt only
    stale = tmp_path / "stale"
    shutil.copytree(trained, stale)
    shutil.copyfile(ROOT / "tests/tokenizer/data/nanochat_92d63d4/token_bytes.pt", stale / "token_bytes.pt")
    with pytest.raises(ValueError, match="does not match tokenizer.json"):
        load_tokenizer_dir(stale)


def test_the_document_that_passes_the_cap_is_kept_and_documents_are_cut():
    assert list(capped_documents(["abcd", "efgh", "ij", "kl"], max_chars=5, doc_cap=3)) == ["abc", "efg"]
    assert list(capped_documents(["abcd", "ef"], max_chars=6, doc_cap=3)) == ["abc", "ef"]


def test_progress_and_phase_lines(trained, tmp_path, capsys):
    assert tok_train(*head_flags(tmp_path / "again")) == 0
    out, err = capsys.readouterr()
    assert "vocab_size: 1,024" in out and "Training time: " in out
    assert re.search(r"^read [\d,]+ characters in [\d,]+ documents \(.*s\); computing 759 merges$", out, re.M), out
    assert "merges completed" in err  # rustbpe's own progress lines
    assert (tmp_path / "again" / "tokenizer.pkl").read_bytes() == (DATA / "tokenizer.pkl").read_bytes()


# ---------------------------------------------------------------- bad input: one line, nothing written or lost


def write_shards(folder: Path, *shards: list) -> Path:
    folder.mkdir(parents=True)
    for i, docs in enumerate(shards):
        pq.write_table(pa.table({"text": docs}), folder / f"shard_{i:05d}.parquet")
    return folder


def refused(capsys, *argv: str) -> str:
    assert tok_train(*argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # progress lines may come first
    errors = [line for line in lines if line.startswith("tok_train: error: ")]
    assert errors == lines[-1:], lines
    return lines[-1]


@pytest.mark.parametrize(
    "docs, expected",
    [
        (["", "", ""], "no training text"),
        (["hello world, hello there"], r"gives only \d+ merges, and --vocab_size 300 needs 35"),
    ],
)
def test_text_empty_or_too_small(tmp_path, capsys, docs, expected):
    data = write_shards(tmp_path / "data", docs, ["val"])
    out = tmp_path / "tok"
    line = refused(capsys, "--vocab_size", "300", "--data_dir", str(data), "--output_dir", str(out))
    assert re.search(expected, line), line
    assert not out.exists()


def test_vocab_size_below_bytes_and_specials(tmp_path, capsys):
    line = refused(capsys, "--vocab_size", "264", "--data_dir", str(DATA / "shards"), "--output_dir", str(tmp_path))
    assert "--vocab_size 264 is too small: at least 265" in line
    with pytest.raises(ValueError, match="at least 265"):
        train_bpe(["abc"], 100)


def test_an_output_dir_holding_a_tokenizer_is_refused_before_training_unless_overwrite(trained, tmp_path, capsys):
    out = tmp_path / "tok"
    shutil.copytree(trained, out)
    (out / "notes.txt").write_text("mine")
    (out / "tokenizer.pkl").write_bytes(b"an older tokenizer")
    empty = write_shards(tmp_path / "data", [""], [""])  # would fail in training: the folder is checked first
    line = refused(capsys, "--data_dir", str(empty), "--output_dir", str(out))
    assert f"--output_dir {out} already holds a tokenizer (tokenizer.json" in line and "--overwrite" in line
    assert (out / "tokenizer.pkl").read_bytes() == b"an older tokenizer"
    assert tok_train(*head_flags(out), "--overwrite") == 0
    assert (out / "tokenizer.pkl").read_bytes() == (DATA / "tokenizer.pkl").read_bytes()
    assert (out / "notes.txt").read_text() == "mine"


def test_a_failed_training_leaves_an_existing_folder_as_it_was(trained, tmp_path, capsys):
    out = tmp_path / "tok"
    shutil.copytree(trained, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    data = write_shards(tmp_path / "data", ["tiny"], ["val"])
    refused(capsys, "--overwrite", "--data_dir", str(data), "--output_dir", str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: d, "no such shard folder"),
        (lambda d: write_shards(d, ["only one"]), "1 shard, at least 2 are needed"),
        (lambda d: d.mkdir(), "no *.parquet shards in the folder"),
    ],
)
def test_missing_or_too_few_shards(tmp_path, capsys, make, expected):
    data = tmp_path / "data"
    make(data)
    line = refused(capsys, "--data_dir", str(data), "--output_dir", str(tmp_path / "tok"))
    assert expected in line and str(data) in line, line


def test_a_shard_without_text_or_not_parquet(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"content": ["x"]}), data / "shard_00000.parquet")
    (data / "shard_00001.parquet").write_bytes(b"not parquet")
    (data / "shard_00002.parquet").write_bytes(b"validation")
    line = refused(capsys, "--data_dir", str(data), "--output_dir", str(tmp_path / "tok"))
    assert line.endswith(
        "shard_00000.parquet: expected a string column 'text' (one document per row), found columns content (string)"
    ), line
    pq.write_table(pa.table({"text": ["x"]}), data / "shard_00000.parquet")
    line = refused(capsys, "--data_dir", str(data), "--output_dir", str(tmp_path / "tok"))
    assert "shard_00001.parquet: not a readable parquet file" in line, line


# ---------------------------------------------------------------- tok_eval


def tok_eval(*argv: str) -> int:
    import runpy

    return runpy.run_path(str(ROOT / "scripts" / "tok_eval.py"))["main"](list(argv))


def test_tok_eval_prints_heads_table(trained, monkeypatch, capsys):
    # HEAD's tok_eval.py ran with its GPT-2 / GPT-4 tiktoken encodings replaced by two tokenizers of its own
    # (data/make_*.py): tiktoken hands out the same two here (our own test files, so unpickled), offline
    import pickle

    import tiktoken

    encodings = {
        "gpt2": DATA.parent / "nanochat_92d63d4" / "tokenizer.pkl",
        "cl100k_base": DATA / "baseline" / "tokenizer.pkl",
    }
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: pickle.loads(encodings[name].read_bytes()))
    assert tok_eval("--tokenizer_dir", str(trained), "--data_dir", str(DATA / "shards"), "--offline") == 0
    assert capsys.readouterr().out == (DATA / "tok_eval.txt").read_text()


def test_tok_eval_offline_says_which_columns_are_skipped(trained, tmp_path, monkeypatch, capsys):
    import requests

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(requests, "get", lambda *a, **k: pytest.fail("tok_eval tried to download"))
    assert tok_eval("--tokenizer_dir", str(trained), "--data_dir", str(DATA / "shards"), "--offline") == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped: ")]
    assert skipped == [
        "skipped: GPT-2 (tiktoken's 'gpt2' is not in its cache and this run is offline); "
        "GPT-4 (tiktoken's 'cl100k_base' is not in its cache and this run is offline)"
    ]
    assert "Comparison with" not in out and "Ours: 1024" in out
    head = (DATA / "tok_eval.txt").read_text()  # ours' columns of HEAD's table: the same counts
    for name in ("news", "climbmix-train", "climbmix-val"):
        row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
        head_row = re.sub(r"\x1b\[\d+m", "", next(line for line in head.splitlines() if line.startswith(f"{name} ")))
        assert row.split()[:4] == [head_row.split()[i] for i in (0, 1, 4, 5)], (row, head_row)


def test_tok_eval_without_a_tokenizer(tmp_path, capsys):
    assert tok_eval("--tokenizer_dir", str(tmp_path), "--data_dir", str(DATA / "shards"), "--offline") == 2
    assert capsys.readouterr().err == (
        f"tok_eval: error: {tmp_path}: no tokenizer (neither tokenizer.json nor tokenizer.pkl): train one with "
        "scripts/tok_train.py\n"
    )
