"""scripts/preview_data.py output, and the cached demo tokenizer."""

import json
import os
import re
import runpy
import stat
from pathlib import Path

import datasets
import pytest

import nanochat_hf.tokenizer as tokenizer_mod
from nanochat_hf.data import demo_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "preview_data.py"


def test_preview_prints_conversations_sizes_and_steps(tmp_path, tokenizer, monkeypatch, capsys):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tokenizer.save_pretrained(tmp_path / "tok")
    mix = tmp_path / "mix.yaml"
    mix.write_text(json.dumps({"tasks": [{"task": "simple_spelling", "size": 40}, {"task": "gsm8k_like_missing"}]}))
    main = runpy.run_path(str(SCRIPT))["main"]
    assert main(["--mixture", str(mix), "--tokenizer", str(tmp_path / "tok")]) == 2
    assert "unknown task 'gsm8k_like_missing'" in capsys.readouterr().err
    mix.write_text(json.dumps({"tasks": [{"task": "simple_spelling", "size": 40}, {"task": "arithmetic", "size": 10}]}))
    args = [
        "--mixture",
        str(mix),
        "--tokenizer",
        str(tmp_path / "tok"),
        "-n",
        "2",
        "--max-seq-len",
        "16",
        "--device-batch-size",
        "2",
        "--total-batch-size",
        "128",
        "--world-size",
        "2",
        "--color",
        "never",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("--- conversation") == 2
    assert "<|assistant_start|>[[" in out and "<|assistant_end|>]]" in out
    assert "simple_spelling" in out and "arithmetic" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert lines["simple_spelling"][1] == "40" and lines["arithmetic"][1] == "10" and lines["total"][1] == "50"
    assert "grad_accum 2" in out
    found = re.search(r"One epoch: ([\d,]+) micro-batches per rank -> ([\d,]+) optimizer steps", out)
    micro, steps = (int(x.replace(",", "")) for x in found.groups())
    assert micro > 0 and 0 < steps <= micro // 2 + 1  # nanochat's epoch end (PackedStream.epoch_steps)


@pytest.mark.slow
def test_preview_shows_the_batch_arithmetic_of_the_run_config(capsys):
    """Without a config, the demo config mid_train uses: 8 rows x 256 tokens, 4096 per step, the demo's 211 steps."""
    main = runpy.run_path(str(SCRIPT))["main"]
    assert main(["-n", "0"]) == 0
    out = capsys.readouterr().out
    assert "1 rank(s) x 8 rows x 256 tokens, grad_accum 2 -> 4,096 tokens per optimizer step" in out
    assert "-> 211 optimizer steps" in out


@pytest.mark.slow
def test_demo_tokenizer_is_trained_once_and_cached(tmp_path, monkeypatch):
    tok = demo_tokenizer(vocab_size=1024, cache_dir=tmp_path)
    assert len(tok) == 1024 and tok.chat_template and tok.bos_token == "<|bos|>"
    assert len(list(tmp_path.glob("demo_tokenizer-1024-*/tokenizer.json"))) == 1
    umask = os.umask(0)
    os.umask(umask)
    folder = next(tmp_path.glob("demo_tokenizer-1024-*"))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask  # not mkdtemp's 0700

    def boom(*a, **k):
        raise AssertionError("trained again although cached")

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", boom)
    again = demo_tokenizer(vocab_size=1024, cache_dir=tmp_path)
    assert again.get_vocab() == tok.get_vocab()
    ids = again("Spell the word: apple")["input_ids"]
    assert ids[0] == again.bos_token_id  # plain text starts with <|bos|>, as in the trained tokenizer
    assert again.decode(ids, skip_special_tokens=True) == "Spell the word: apple"
