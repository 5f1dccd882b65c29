"""Mixtures: YAML files, nanochat's shipped mixtures, deterministic shuffle, bad input reported clearly."""

import json
import random
from pathlib import Path

import pytest
import yaml

from nanochat_hf.data import DEMO_MIXTURE, load_mixture, loads, read_mixture
from nanochat_hf.tasks.spelling import simple_spelling, spelling_bee

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "mixtures"


def write_yaml(tmp_path, config, name="mix.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def spec_tuples(specs):
    return [(s.task, s.split, s.config, s.start, s.stop, s.repeat, s.size) for s in specs]


def test_nanochat_mixtures_shipped(tmp_path, monkeypatch):
    (tmp_path / "identity_conversations.jsonl").write_text("")
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    seed, specs, _ = read_mixture(CONFIGS / "nanochat_train.yaml")
    assert seed == 42
    assert spec_tuples(specs) == [
        ("smoltalk", "train", None, 0, None, 1, None),
        ("mmlu", "train", "auxiliary_train", 0, None, 1, None),
        ("gsm8k", "train", "main", 0, None, 1, None),
        ("identity", "train", None, 0, None, 2, None),
        ("simple_spelling", "train", None, 0, None, 1, 200_000),
        ("spelling_bee", "train", None, 0, None, 1, 80_000),
    ]
    seed, specs, _ = read_mixture(CONFIGS / "nanochat_val.yaml", split="val")
    assert seed == 42
    assert spec_tuples(specs) == [
        ("smoltalk", "test", None, 0, None, 1, None),
        ("mmlu", "test", "all", 0, 5200, 1, None),
        ("gsm8k", "test", "main", 0, 420, 1, None),
    ]


def test_demo_yaml_is_the_embedded_demo(caplog_data):
    assert yaml.safe_load((CONFIGS / "demo.yaml").read_text()) == DEMO_MIXTURE
    ds = load_mixture(None, split="val")
    assert "offline demo mixture" in caplog_data.text
    assert 200 <= len(ds) <= 1000 and set(ds["task"]) == {
        "simple_spelling",
        "spelling_bee",
        "arithmetic",
        "multiple_choice",
    }
    held_out = load_mixture(None, split="spelling_eval")
    assert len(held_out) == 200 and set(held_out["task"]) == {"simple_spelling"}
    # held-out = test seeds 1000..1199, disjoint from val's (0..99); on the small demo word list the same word
    # (hence the same text) may recur, as it does between nanochat's train and test rows
    assert sorted(json.dumps(loads(r), sort_keys=True) for r in held_out) == sorted(
        json.dumps(simple_spelling(i, "test", "demo"), sort_keys=True) for i in range(1000, 1200)
    )


def test_order_is_nanochat_shuffle_with_repeats_and_slices(tmp_path):
    path = write_yaml(
        tmp_path,
        {
            "seed": 7,
            "tasks": [
                {"task": "SimpleSpelling", "size": 10, "start": 2, "stop": 7},
                {"task": "spelling-bee", "size": 3, "repeat": 2},
            ],
        },
    )
    ds = load_mixture(path)
    expected = [simple_spelling(i, "train") for i in range(2, 7)] + [spelling_bee(i, "train") for i in range(3)] * 2
    order = list(range(len(expected)))
    random.Random(7).shuffle(order)
    assert [loads(r) for r in ds] == [expected[i] for i in order]
    # a task without `split` reads the test seeds when loading a non-train split
    val = load_mixture(write_yaml(tmp_path, {"tasks": [{"task": "simple_spelling", "size": 2}]}), split="val")
    assert sorted(map(json.dumps, map(loads, val))) == sorted(json.dumps(simple_spelling(i, "test")) for i in range(2))


BAD_IDENTITY_LINES = [
    json.dumps([{"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"}]),
    json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),  # roles out of order
    json.dumps([{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]),  # non-string content
    json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "image", "text": "x"}]}]),
    json.dumps([]),  # empty conversation
    '[{"role": "user", "content": "broken"',  # not JSON
    json.dumps([{"role": "user", "content": "second"}, {"role": "assistant", "content": "good"}]),
]
BAD_SMOLTALK = [
    {"messages": [{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "?"}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"messages": []},
]


def bad_mixture(tmp_path):
    ident = tmp_path / "identity.jsonl"
    ident.write_text("\n".join(BAD_IDENTITY_LINES) + "\n")
    smol = tmp_path / "smol.jsonl"
    smol.write_text("".join(json.dumps(r) + "\n" for r in BAD_SMOLTALK))
    return write_yaml(
        tmp_path, {"tasks": [{"task": "identity", "path": str(ident)}, {"task": "smoltalk", "data_files": [str(smol)]}]}
    )


def test_malformed_rows_skipped_counted_and_named(tmp_path, hf_cache, caplog_data):
    ds = load_mixture(bad_mixture(tmp_path), cache_dir=hf_cache)
    assert sorted(loads(r)["messages"][0]["content"] for r in ds) == ["hi", "ok", "second"]
    warnings = [r for r in caplog_data.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "skipped 7 malformed row(s) (identity[train]: 5, smoltalk[train]: 2)" in msg
    assert "identity.jsonl) row 1: message 1 has role 'user', expected 'assistant'" in msg
    assert "row 2: message 0 (user) content must be a string or a list of text parts, got int" in msg
    assert "row 3: message 1 (assistant) content part 0: unknown part type 'image'" in msg
    assert "row 4: conversation is empty" in msg
    assert "row 5: invalid JSON" in msg


def test_strict_raises_on_first_malformed_row(tmp_path, hf_cache):
    with pytest.raises(ValueError, match=r"identity\[train\] \(.*identity.jsonl\) row 1: message 1 has role 'user'"):
        load_mixture(bad_mixture(tmp_path), strict=True, cache_dir=hf_cache)


@pytest.mark.parametrize(
    "config, error, match",
    [
        (
            {"tasks": [{"task": "simple_spelling", "size": 3}, {"task": "wikipedia"}]},
            ValueError,
            r"task #1: unknown task 'wikipedia' \(known: arithmetic, .*\)",
        ),
        ({"tasks": [{"task": "smoltalk", "splt": "train"}]}, ValueError, r"task #0: unknown key 'splt'"),
        ({"seed": 42, "shuffle": True, "tasks": [{"task": "smoltalk"}]}, ValueError, r"unknown key 'shuffle'"),
        ({"tasks": []}, ValueError, r"empty mixture"),
        (
            {"tasks": [{"task": "gsm8k", "data_files": ["nope/missing.parquet"]}]},
            FileNotFoundError,
            r"task #0 \(gsm8k\): data file not found: .*nope/missing.parquet",
        ),
        (
            {"tasks": [{"task": "identity", "path": "missing.jsonl"}]},
            FileNotFoundError,
            r"conversation file not found: .*missing.jsonl",
        ),
        ({"tasks": [{"task": "spelling_bee"}]}, ValueError, r"synthetic task needs 'size'"),
        (
            {"tasks": [{"task": "simple_spelling", "size": 3, "words": "common"}]},
            ValueError,
            r"task #0 \(simple_spelling\): unknown word list 'common' \(expected one of: full, demo\)",
        ),
        (
            {"tasks": [{"task": "arithmetic", "size": 3, "words": "demo"}]},
            ValueError,
            r"'words' only applies to simple_spelling, spelling_bee",
        ),
        ({"tasks": [{"task": "gsm8k", "repeat": 0}]}, ValueError, r"repeat must be a positive integer, got 0"),
        (
            {"train": {"tasks": [{"task": "gsm8k"}]}},
            ValueError,
            r"no 'tasks' and no split 'val' \(splits in file: train\)",
        ),
    ],
)
def test_bad_mixture_fails_before_loading_data(tmp_path, monkeypatch, config, error, match):
    monkeypatch.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("data read before validation"))
    with pytest.raises(error, match=match):
        load_mixture(write_yaml(tmp_path, config), split="val")


def test_missing_or_unparsable_mixture_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="mixture file not found: .*nothere.yaml"):
        load_mixture(tmp_path / "nothere.yaml")
    (tmp_path / "bad.yaml").write_text("tasks: [unclosed")
    with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
        load_mixture(tmp_path / "bad.yaml")


def test_all_rows_malformed_is_an_empty_mixture(tmp_path):
    ident = tmp_path / "identity.jsonl"
    ident.write_text("[]\nnot json\n")
    with pytest.raises(ValueError, match="empty mixture"):
        load_mixture(write_yaml(tmp_path, {"tasks": [{"task": "identity", "path": str(ident)}]}))
