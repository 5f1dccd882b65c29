"""The tasks' training conversations: fixture files in each hub dataset's layout go through the hub loading code and
a mixture and render as nanochat does (docs/nanochat.md, section 4); the spelling tasks draw nanochat's rows."""

import json
import random
import re
import string

import pytest
from datasets import Dataset

import nanochat_hf.data.mixture as mixture_mod
from nanochat_hf.data import demo_words, english_words, load_mixture, loads, word_list
from nanochat_hf.tasks.spelling import simple_spelling, spelling_bee
from nanochat_hf.tokenizer import render_conversation


def mixture_file(tmp_path, tasks, seed=42):
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"seed": seed, "tasks": tasks}))  # JSON is valid YAML
    return path


MMLU_PROMPT_0 = (
    "Multiple Choice question: What is 2 + 2?\n- 3=A\n- 4=B\n- 5=C\n- 22=D\n\n"
    "Respond only with the letter of the correct answer."
)


@pytest.mark.parametrize("layout", ["auxiliary_train_jsonl", "all_parquet"])
def test_mmlu_fixture_renders_byte_for_byte(tmp_path, hf_cache, layout, fx):
    MMLU_ROWS = fx.MMLU_ROWS
    if layout == "auxiliary_train_jsonl":  # auxiliary_train wraps every row in a `train` column
        f = fx.write_jsonl(tmp_path / "aux.jsonl", [{"train": r} for r in MMLU_ROWS])
    else:
        f = tmp_path / "test.parquet"
        Dataset.from_list(MMLU_ROWS).to_parquet(str(f))
    ds = load_mixture(
        mixture_file(tmp_path, [{"task": "mmlu", "split": "train", "data_files": [str(f)]}]), cache_dir=hf_cache
    )
    convs = {loads(r)["messages"][0]["content"]: loads(r)["messages"] for r in ds}
    assert convs[MMLU_PROMPT_0] == [{"role": "user", "content": MMLU_PROMPT_0}, {"role": "assistant", "content": "B"}]
    last = [m for p, m in convs.items() if "Pick the last" in p][0]
    assert last[0]["content"].encode() == (
        b"Multiple Choice question: Pick the last\n- a b=A\n- c=B\n- d=C\n- e=f=D\n"
        b"\nRespond only with the letter of the correct answer."
    )
    assert last[1]["content"] == "D"
    assert set(ds["task"]) == {"mmlu"}


def test_gsm8k_fixture_becomes_tool_parts(tmp_path, hf_cache, fx):
    GSM8K_ROWS = fx.GSM8K_ROWS
    f = tmp_path / "train.parquet"
    Dataset.from_list(GSM8K_ROWS).to_parquet(str(f))
    ds = load_mixture(
        mixture_file(tmp_path, [{"task": "gsm8k", "split": "train", "data_files": [str(f)]}]), cache_dir=hf_cache
    )
    convs = {loads(r)["messages"][0]["content"]: loads(r)["messages"][1]["content"] for r in ds}
    assert convs[GSM8K_ROWS[0]["question"]] == [
        {"type": "text", "text": "Natalia sold 48/2 = "},
        {"type": "python", "text": "48/2"},
        {"type": "python_output", "text": "24"},
        {"type": "text", "text": "24 clips in May.\nNatalia sold 48+24 = "},
        {"type": "python", "text": "48+24"},
        {"type": "python_output", "text": "72"},
        {"type": "text", "text": "72 clips altogether in April and May.\n#### 72"},
    ]
    assert convs["What is 3 times 4?"][-1]["text"].endswith("#### 12")


def test_smoltalk_fixture_keeps_system_and_turns(tmp_path, hf_cache, tokenizer, fx):
    SMOLTALK_ROWS = fx.SMOLTALK_ROWS
    f = tmp_path / "train.parquet"
    Dataset.from_list(SMOLTALK_ROWS).to_parquet(str(f))
    ds = load_mixture(
        mixture_file(tmp_path, [{"task": "SmolTalk", "split": "train", "data_files": [str(f)]}]), cache_dir=hf_cache
    )
    convs = sorted((loads(r) for r in ds), key=lambda c: len(c["messages"]))
    assert convs[0]["messages"] == SMOLTALK_ROWS[0]["messages"]
    assert convs[1]["messages"] == SMOLTALK_ROWS[1]["messages"]
    ids, _ = render_conversation(tokenizer, convs[1])
    assert "Be brief.\n\nCapital of France?" in tokenizer.decode(ids)  # system merged by the renderer


def test_hub_path_uses_real_names(monkeypatch, tmp_path, hf_cache, fx):
    MMLU_ROWS, GSM8K_ROWS, SMOLTALK_ROWS = fx.MMLU_ROWS, fx.GSM8K_ROWS, fx.SMOLTALK_ROWS
    calls = []
    layouts = {
        "cais/mmlu": [{"train": r} for r in MMLU_ROWS],
        "openai/gsm8k": GSM8K_ROWS,
        "HuggingFaceTB/smol-smoltalk": SMOLTALK_ROWS,
    }

    def fake_load_dataset(name, config=None, split=None, cache_dir=None):
        calls.append((name, config, split))
        return Dataset.from_list(layouts[name])

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    ds = load_mixture(
        mixture_file(
            tmp_path,
            [
                {"task": "smoltalk", "split": "train"},
                {"task": "mmlu", "split": "train", "config": "auxiliary_train"},
                {"task": "gsm8k", "split": "train", "stop": 1},
            ],
        ),
        cache_dir=hf_cache,
    )
    assert calls == [
        ("HuggingFaceTB/smol-smoltalk", None, "train"),
        ("cais/mmlu", "auxiliary_train", "train"),
        ("openai/gsm8k", "main", "train"),
    ]
    assert sorted(ds["task"]) == ["gsm8k"] + ["mmlu"] * 3 + ["smoltalk"] * 2
    assert MMLU_PROMPT_0 in [loads(r)["messages"][0]["content"] for r in ds]


def test_identity_rows(tmp_path, fx):
    IDENTITY_ROWS = fx.IDENTITY_ROWS
    f = fx.write_jsonl(tmp_path / "identity.jsonl", IDENTITY_ROWS)
    ds = load_mixture(mixture_file(tmp_path, [{"task": "identity", "path": str(f), "repeat": 2}]))
    assert len(ds) == 4
    assert sorted(json.dumps(loads(r)["messages"]) for r in ds) == sorted(json.dumps(r) for r in IDENTITY_ROWS * 2)


def test_shipped_demo_identity_is_about_nanochat_hf():
    ds = load_mixture(None, split="train")
    ident = [loads(r) for r in ds if r["task"] == "demo_identity"]
    assert len(ident) >= 8 * 40
    assert any("nanochat-hf" in m["content"] for c in ident for m in c["messages"] if m["role"] == "assistant")


def test_word_list():
    words = english_words()
    assert len(words) > 200_000
    assert list(words) == sorted(words) and all(re.fullmatch("[a-z]+", w) for w in words[::1000])


def test_demo_word_list_is_small_fixed_and_used_by_the_demo_spelling_rows(tmp_path):
    words = demo_words()
    assert len(words) == 256 and list(words) == sorted(set(words)) and "apple" in words
    assert set(words) <= set(english_words()) and all(3 <= len(w) <= 7 for w in words)
    assert words[:3] == ("abele", "agatine", "ahem")  # fixed draw: same list on every machine
    assert word_list("full") is english_words()
    with pytest.raises(ValueError, match=r"unknown word list 'Demo' \(expected one of: full, demo\)"):
        word_list("Demo")
    for split in ("train", "test"):  # same seed -> same draw as nanochat's, from the demo list
        assert simple_spelling(7, split, "demo") == reference_simple_spelling(
            reference_simple_spelling_words(words), 7, split
        )
        word, letter, _ = reference_spelling_bee_draw(words, 7, split)
        assert spelling_bee(7, split, "demo")["messages"][1]["content"][1]["text"] == f"'{word}'.count('{letter}')"
    path = mixture_file(
        tmp_path,
        [
            {"task": "simple_spelling", "size": 300, "words": "demo"},
            {"task": "spelling_bee", "size": 100, "words": "demo"},
        ],
    )
    for split in ("train", "val"):
        drawn = {
            re.search(r"'([a-z]+)'\.count", c["messages"][1]["content"][1]["text"]).group(1)
            if isinstance(c["messages"][1]["content"], list)
            else c["messages"][1]["content"].split(":")[0]
            for c in map(loads, load_mixture(path, split=split))
        }
        assert drawn <= set(words) and len(drawn) > 100
    demo = {loads(r)["messages"][1]["content"].split(":")[0] for r in load_mixture(None, split="spelling_eval")}
    assert demo <= set(words)  # the demo's held-out rows ask for words its train rows use


def reference_simple_spelling_words(words) -> list[str]:
    """nanochat's SimpleSpelling word order, written from its description: a copy shuffled once, Random(42)."""
    shuffled = list(words)
    random.Random(42).shuffle(shuffled)
    return shuffled


def reference_simple_spelling(shuffled, index: int, split: str) -> dict:
    """nanochat's SimpleSpelling row: one rng.choice from random.Random(index), or 10_000_000 + index off train."""
    word = random.Random(index if split == "train" else 10_000_000 + index).choice(shuffled)
    return {
        "messages": [
            {"role": "user", "content": f"Spell the word: {word}"},
            {"role": "assistant", "content": f"{word}:{','.join(word)}"},
        ]
    }


def reference_spelling_bee_draw(words, index: int, split: str) -> tuple[str, str, int]:
    """nanochat's SpellingBee (word, letter, count): the list as read; the letter is one of the word's with
    probability 0.9, else any lower-case letter."""
    rng = random.Random(index if split == "train" else 10_000_000 + index)
    word = rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(string.ascii_lowercase)
    return word, letter, word.count(letter)


def test_simple_spelling_rows_equal_nanochats():
    words = english_words()
    shuffled = reference_simple_spelling_words(words)
    for split in ("train", "test"):
        ours = [simple_spelling(i, split) for i in range(150)]
        assert ours == [reference_simple_spelling(shuffled, i, split) for i in range(150)]
    assert english_words() == tuple(sorted(words))  # the shuffle works on a copy: SpellingBee's order is kept
    # the shuffle matters: without it, (almost) every row would ask for another word
    unshuffled = [random.Random(i).choice(words) for i in range(150)]
    assert (
        sum(
            simple_spelling(i, "train")["messages"][0]["content"] == f"Spell the word: {w}"
            for i, w in enumerate(unshuffled)
        )
        < 5
    )


def test_spelling_bee_draws_nanochats_word_letter_and_count():
    words = english_words()
    for split in ("train", "test"):
        for i in range(150):
            word, letter, count = reference_spelling_bee_draw(words, i, split)
            parts = spelling_bee(i, split)["messages"][1]["content"]
            assert parts[1]["text"] == f"'{word}'.count('{letter}')" and parts[2]["text"] == str(count)


def test_spelling_bee_counts_and_final_answer():
    prompts = set()
    for split in ("train", "test"):
        for i in range(150):
            conv = spelling_bee(i, split)
            assert conv == spelling_bee(i, split)  # seeded per row
            user, parts = conv["messages"][0]["content"], conv["messages"][1]["content"]
            prompts.add(user)
            word = random.Random(i if split == "train" else 10_000_000 + i).choice(english_words())
            assert [p["type"] for p in parts] == ["text", "python", "python_output", "text"]
            m = re.fullmatch(r"'([a-z]+)'\.count\('([a-z])'\)", parts[1]["text"])
            assert m and m.group(1) == word
            count = word.count(m.group(2))
            assert parts[2]["text"] == str(count)
            assert parts[3]["text"].endswith(f"My final answer is:\n\n#### {count}")
            assert f"{word}:{','.join(word)}" in parts[0]["text"]
            for j, ch in enumerate(word, 1):
                assert re.search(rf"^{j}:{ch}( hit! count=\d+)?$", parts[0]["text"], re.M)
            hits = re.findall(r"hit! count=(\d+)", parts[0]["text"])
            assert [int(h) for h in hits] == list(range(1, count + 1))
    assert len(prompts) > 250
    assert sum(any(ord(c) > 127 for c in p) for p in prompts) > 20  # several languages


def _hub_rows(task: str, n: int) -> list[dict]:
    """n distinct rows in the hub dataset's column layout."""
    if task == "mmlu":  # auxiliary_train wraps every row in a `train` column
        return [
            {"train": {"question": f"Question {i}?", "subject": "", "choices": ["a", "b", "c", "d"], "answer": i % 4}}
            for i in range(n)
        ]
    if task == "gsm8k":
        return [
            {"question": f"What is {i} plus 1?", "answer": f"{i}+1=<<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"}
            for i in range(n)
        ]
    return [
        {
            "messages": [{"role": "user", "content": f"Message {i}"}, {"role": "assistant", "content": "ok"}],
            "source": "fixture",
        }
        for i in range(n)
    ]


def _row_key(task: str, row: dict) -> str:
    """The source row's identifying text: the question / first user message."""
    return (
        row["train"]["question"]
        if task == "mmlu"
        else row["question"]
        if task == "gsm8k"
        else row["messages"][0]["content"]
    )


def _conversation_key(task: str, conversation: dict) -> str:
    user = conversation["messages"][0]["content"]
    return re.match(r"Multiple Choice question: (.*)\n", user).group(1) if task == "mmlu" else user


@pytest.mark.parametrize("task,ext", [("mmlu", "jsonl"), ("gsm8k", "parquet"), ("smoltalk", "parquet")])
def test_hub_tasks_slice_the_rows_shuffled_with_seed_42(tmp_path, hf_cache, fx, task, ext):
    rows = _hub_rows(task, 60)
    f = tmp_path / f"rows.{ext}"
    fx.write_jsonl(f, rows) if ext == "jsonl" else Dataset.from_list(rows).to_parquet(str(f))
    spec = mixture_mod.TaskSpec(task=task, split="test", start=5, stop=25, data_files=[str(f)])
    got = [_conversation_key(task, loads(r)) for r in mixture_mod.load_task(spec, cache_dir=hf_cache).dataset]
    # nanochat: rows shuffled right after loading, start/stop slice the shuffled rows (in that order)
    expected = [_row_key(task, r) for r in Dataset.from_list(rows).shuffle(seed=42).select(range(5, 25))]
    assert got == expected
    assert set(got) != {_row_key(task, r) for r in rows[5:25]}
    # through a mixture: the same rows (the mixture then shuffles all tasks together)
    path = mixture_file(tmp_path, [{"task": task, "split": "test", "start": 5, "stop": 25, "data_files": [str(f)]}])
    assert sorted(
        _conversation_key(task, loads(r)) for r in load_mixture(path, split="val", cache_dir=hf_cache)
    ) == sorted(expected)


def test_skipped_hub_rows_are_named_by_their_row_in_the_file(tmp_path, hf_cache, fx):
    rows = _hub_rows("smoltalk", 30)
    for i in (3, 17):
        rows[i] = {"messages": [{"role": "user", "content": f"Message {i}"}], "source": "fixture"}  # no answer
    f = fx.write_jsonl(tmp_path / "smol.jsonl", rows)
    result = mixture_mod.load_task(mixture_mod.TaskSpec(task="smoltalk", data_files=[str(f)]), cache_dir=hf_cache)
    assert [row for row, _ in result.bad] == [3, 17] and len(result.dataset) == 28


def test_gsm8k_keeps_empty_text_parts(tmp_path, hf_cache, tokenizer):
    answer = "<<2+3=5>>5 apples, <<5*2=10>><<10-1=9>>9 left\n#### 9"
    f = tmp_path / "gsm8k.parquet"
    Dataset.from_list([{"question": "Apples?", "answer": answer}]).to_parquet(str(f))
    rows = load_mixture(
        mixture_file(tmp_path, [{"task": "gsm8k", "data_files": [str(f)]}]), strict=True, cache_dir=hf_cache
    )
    conversation = loads(rows[0])
    parts = conversation["messages"][1]["content"]
    assert parts == [
        {"type": "text", "text": ""},
        {"type": "python", "text": "2+3"},
        {"type": "python_output", "text": "5"},
        {"type": "text", "text": "5 apples, "},
        {"type": "python", "text": "5*2"},
        {"type": "python_output", "text": "10"},
        {"type": "text", "text": ""},
        {"type": "python", "text": "10-1"},
        {"type": "python_output", "text": "9"},
        {"type": "text", "text": "9 left\n#### 9"},
    ]
    # empty parts add no tokens: the rendering is that of the answer without them
    ids, _ = render_conversation(tokenizer, conversation)
    non_empty = [p for p in parts if p["text"] or p["type"] != "text"]
    assert (
        ids
        == render_conversation(
            tokenizer, {"messages": [conversation["messages"][0], {"role": "assistant", "content": non_empty}]}
        )[0]
    )
