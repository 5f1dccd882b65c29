"""benchmarks/generation.py runs end to end at tiny sizes: it prints its table and both models pick the same tokens."""

from __future__ import annotations

import torch


def test_prints_table_and_same_tokens(generation, capsys):
    rows = generation.main(
        [
            "--depth",
            "1",
            "--vocab",
            "512",
            "--prompt_len",
            "6",
            "--new_tokens",
            "5",
            "--repeats",
            "1",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr().out
    assert "ours tok/s" in out and "native tok/s" in out and "ours/native" in out
    assert [(r["batch"], r["new_tokens"]) for r in rows] == [(1, 5), (8, 5)]  # min_new_tokens: no early stop
    lines = [line.split() for line in out.splitlines() if line.split()[:2] in (["1", "5"], ["8", "5"])]
    assert len(lines) == 2 and all(line[-1] == "yes" for line in lines), out
    assert all(r["same_tokens"] and r["ours"] > 0 and r["native"] > 0 for r in rows)


def test_prompts_are_left_padded_with_different_lengths(generation):
    batch = generation.prompts(8, 12, 100)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    lengths = mask.sum(-1).tolist()
    assert lengths[0] == 12 and len(set(lengths)) > 1 and min(lengths) >= 6
    for row, n in enumerate(lengths):
        assert mask[row, -n:].all() and not mask[row, :-n].any()  # padding on the left only
        assert ids[row, -n] == generation.BOS and (ids[row, :-n] == generation.PAD).all()


def test_differing_tokens_are_reported(generation):
    a = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    b = a.clone()
    b[1, 3] = 9
    assert generation.first_difference(a, b, prompt_len=2) == "first difference: row 1, new token 1"
