"""One base-dir default and one cache-key scheme (nanochat_hf.paths), used by every caller."""

import dataclasses
import importlib
import json
import sys

import pytest

from nanochat_hf import tasks
from nanochat_hf.conversion import find_nanochat_checkpoint
from nanochat_hf.data import mixture
from nanochat_hf.paths import cache_key, nanochat_base_dir


def test_nanochat_base_dir_is_one_default_for_checkpoints_and_the_identity_file(tmp_path, monkeypatch):
    monkeypatch.delenv("NANOCHAT_BASE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert nanochat_base_dir() == tmp_path / "home" / ".cache" / "nanochat"
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "base"))
    assert nanochat_base_dir() == tmp_path / "base"
    assert tasks.MIXTURE_TASKS["identity"].default_file() == tmp_path / "base" / "identity_conversations.jsonl"
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "base")):  # the checkpoint search looks there too
        find_nanochat_checkpoint()


def test_cache_key_follows_inputs_and_the_source_code(tmp_path, monkeypatch):
    package = tmp_path / "keyed_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = importlib.import_module("keyed_pkg")
    helper = importlib.import_module("keyed_pkg.helper")
    before = (cache_key("data", helper.f), cache_key("data", pkg))
    assert before == (cache_key("data", helper.f), cache_key("data", pkg))  # deterministic
    assert cache_key("other data", helper.f) != before[0]
    assert cache_key("a", "b") != cache_key("ab")  # parts stay apart
    (package / "helper.py").write_text("def f():\n    return 2\n")
    helper = importlib.reload(helper)
    assert cache_key("data", helper.f) != before[0]
    assert cache_key("data", pkg) != before[1]  # a package's key covers every file in it, not only __init__
    sys.modules.pop("keyed_pkg.helper")
    sys.modules.pop("keyed_pkg")


def test_hub_task_conversion_is_cached_by_the_data_and_the_converting_code(tmp_path, monkeypatch):
    rows = [{"question": "What is 3 times 4?", "answer": "3*4=<<3*4=12>>12\n#### 12"}]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = mixture.TaskSpec(task="gsm8k", data_files=[str(data)])
    cache = str(tmp_path / "cache")
    first = mixture.load_task(spec, cache_dir=cache).dataset["conversation"]
    calls = []
    gsm8k = dataclasses.replace(tasks.MIXTURE_TASKS["gsm8k"], conversation=lambda row: calls.append(row))
    monkeypatch.setitem(tasks.MIXTURE_TASKS, "gsm8k", gsm8k)
    assert mixture.load_task(spec, cache_dir=cache).dataset["conversation"] == first and not calls  # cached
    real = mixture.cache_key
    monkeypatch.setattr(mixture, "cache_key", lambda *parts: real("edited converter", *parts))  # as if code changed
    mixture.load_task(spec, cache_dir=cache)
    assert len(calls) == 1  # converted again
