"""Every nanochat model generation (G0-G5) converts both ways, checked against what nanochat's own code does.

The fixtures (conftest.write_generation_checkpoint) are checkpoints as nanochat writes them at each generation's
commit: the tensor names, order and shapes of nanochat's GPT there (data/nanochat_generations.json), ``_orig_mod.``
names, bf16 embeddings, meta json with and without window_pattern. The reference logits (data/nanochat_logits.pt)
are nanochat's GPT.forward at that commit on the same weights (float32, CPU); data/make_nanochat_reference.py made
both files from nanochat's code (seed 0, torch 2.13, CPU).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanochat_hf import NanoChatGPTConfig
from nanochat_hf.conversion import from_nanochat, load_from_nanochat, read_nanochat_checkpoint, to_nanochat, to_native
from nanochat_hf.conversion.generations import nanochat_shapes
from nanochat_hf.errors import UserError

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "nanochat_generations.json").read_text())
COMMITS = list(REFERENCE["commits"])
STEP = 5  # conftest.write_generation_checkpoint's default
EXPECTED_FIELDS = {  # what each generation sets, from nanochat/gpt.py at its commit
    "G0": {},
    "G1": {"residual_lambdas": True},
    "G2": {"residual_lambdas": True},
    "G3": {"residual_lambdas": True, "value_embeddings": True, "ve_gate_channels": 32, "ve_gate_scale": 2.0},
    "G4": {
        "residual_lambdas": True,
        "value_embeddings": True,
        "ve_gate_channels": 12,
        "ve_gate_scale": 3.0,
        "qk_scale": 1.15,
        "rope_theta": 100000.0,
    },
    "G5": {
        "residual_lambdas": True,
        "value_embeddings": True,
        "ve_gate_channels": 12,
        "ve_gate_scale": 3.0,
        "qk_scale": 1.2,
        "rope_theta": 100000.0,
        "smear": True,
        "backout": True,
    },
}


def checkpoint(base: Path, commit: str) -> Path:
    return base / "base_checkpoints" / commit


@pytest.mark.parametrize("commit", COMMITS)
def test_detects_the_generation_and_its_config(generation_base, commit):
    state, config, meta, step = read_nanochat_checkpoint(checkpoint(generation_base, commit))
    entry = REFERENCE["commits"][commit]
    generation = entry["generation"]
    defaults = NanoChatGPTConfig()
    for name in ("residual_lambdas", "value_embeddings", "qk_scale", "rope_theta", "smear", "backout"):
        assert getattr(config, name) == EXPECTED_FIELDS[generation].get(name, getattr(defaults, name)), name
    if config.value_embeddings:
        assert (config.ve_gate_channels, config.ve_gate_scale) == (
            EXPECTED_FIELDS[generation]["ve_gate_channels"],
            EXPECTED_FIELDS[generation]["ve_gate_scale"],
        )
    # nanochat's own window sizes (FlashAttention's (w, 0): w keys before the query, plus itself)
    windows = [w for w, _ in entry["window_sizes"]] or [config.sequence_len] * config.n_layer
    assert config.layer_types == ["sliding_attention" if w < config.sequence_len else "full_attention" for w in windows]
    assert config.sliding_window == (min(windows) + 1 if min(windows) < config.sequence_len else None)
    assert config.padded_vocab_size == (300 if commit == "790f3be" else 320)  # vocab padded to 64 from bc51da8
    # the tensors nanochat's GPT has at that commit, in its order, with its shapes; dtypes as stored
    assert [(k, list(s)) for k, s in nanochat_shapes(config).items()] == [(k, s) for k, s in entry["tensors"].items()]
    assert list(state) == list(entry["tensors"])
    assert {k for k, v in state.items() if v.dtype == torch.bfloat16} == {
        k for k in state if k == "transformer.wte.weight" or k.startswith("value_embeds.")
    }


@pytest.mark.parametrize("commit", COMMITS)
def test_round_trip_is_bit_exact(generation_base, tmp_path, commit):
    source = checkpoint(generation_base, commit)
    hf = from_nanochat(source, tmp_path / "hf", generation_base / "tokenizer", trust_pickle=True)
    out = tmp_path / "nanochat" / "base_checkpoints" / commit
    to_nanochat(hf, out)
    original = torch.load(source / f"model_{STEP:06d}.pt", weights_only=True)
    back = torch.load(out / f"model_{STEP:06d}.pt", weights_only=True)
    # nanochat's names (base_train saves the uncompiled model: no _orig_mod.), in its order, dtypes as stored
    assert list(back) == list(REFERENCE["commits"][commit]["tensors"])
    for key, tensor in original.items():
        name = key.removeprefix("_orig_mod.")
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    # the meta json comes back byte for byte: model_config with window_pattern exactly where nanochat writes it
    assert (out / f"meta_{STEP:06d}.json").read_bytes() == (source / f"meta_{STEP:06d}.json").read_bytes()
    assert (tmp_path / "nanochat" / "tokenizer" / "tokenizer.pkl").is_file()  # nanochat's layout


@pytest.mark.parametrize("commit", COMMITS)
def test_converted_model_gives_nanochat_logits(generation_base, commit):
    checkpoint_dir = checkpoint(generation_base, commit)
    model, _ = load_from_nanochat(checkpoint_dir, generation_base / "tokenizer", trust_pickle=True)
    # nanochat's rotary tables: bfloat16 up to 1076f97 (G0-G3), then the compute dtype (G4, G5: float32 here)
    assert model.config.rotary_dtype == ("compute" if commit in ("6ed7d1d", "a825e63") else "bfloat16")
    with torch.no_grad():
        logits = model(torch.tensor([REFERENCE["ids"]])).logits[0, REFERENCE["positions"]]
    expected = torch.load(DATA / "nanochat_logits.pt", weights_only=True)[commit]
    assert (logits - expected).abs().max().item() < 1e-5


def test_the_folders_nanochat_of_each_generation_reads(generation_base, tmp_path):
    """HEAD's load_model knows base, sft and rl: a G4/G5 model written to mid_checkpoints (a folder only nanochat
    before 1ddaad1 read) is refused in one line saying where a fine-tuned model goes; a G0 one is written there."""
    for commit, allowed in (("a825e63", False), ("6ed7d1d", False), ("790f3be", True)):
        hf = from_nanochat(
            checkpoint(generation_base, commit), tmp_path / commit, generation_base / "tokenizer", trust_pickle=True
        )
        out = tmp_path / "nanochat" / "mid_checkpoints" / commit
        if allowed:
            to_nanochat(hf, out)
            assert (out / f"model_{STEP:06d}.pt").is_file()
            continue
        with pytest.raises(
            UserError, match=r"has no mid_checkpoints .* <base>/chatsft_checkpoints/<tag>, where chat_eval"
        ):
            to_nanochat(hf, out)
        assert not out.exists()
        to_nanochat(hf, tmp_path / "nanochat" / "chatsft_checkpoints" / commit)


# ------------------------------------------------------------------------------------------- window_pattern


def test_missing_window_pattern_comes_from_the_parent_base_checkpoint(
    generation_base, write_generation, tmp_path, caplog
):
    base = tmp_path / "nanochat"
    write_generation(base / "base_checkpoints" / "d3", "a825e63", orig_mod=False)  # base_train: plain names
    sft = base / "chatsft_checkpoints" / "d3"
    write_generation(sft, "a825e63", step=9, window_pattern=False)  # SFT meta before 8b4849d
    with caplog.at_level(logging.WARNING):
        _, config, _, _ = read_nanochat_checkpoint(sft)
    assert config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    [record] = caplog.records
    assert "window_pattern" in record.message and str(base / "base_checkpoints" / "d3") in record.message
    # without the parent: "L" on every layer, as nanochat's own loader assumes, said in one line
    shutil.rmtree(base / "base_checkpoints")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _, config, _, _ = read_nanochat_checkpoint(sft)
    assert config.layer_types == ["full_attention"] * 3 and config.sliding_window is None
    [record] = caplog.records
    assert "assumed 'L'" in record.message and "meta_000009.json" in record.message and "\n" not in record.message
    # written back with the pattern it was read with (nanochat's loader of a825e63 builds the same model)
    hf = from_nanochat(sft, tmp_path / "hf", generation_base / "tokenizer", trust_pickle=True)
    to_nanochat(hf, tmp_path / "back" / "chatsft_checkpoints" / "d3")
    meta = json.loads((tmp_path / "back" / "chatsft_checkpoints" / "d3" / "meta_000009.json").read_text())
    assert meta["model_config"]["window_pattern"] == "L"


def test_a_g1_base_checkpoint_needs_no_window_pattern(generation_base, caplog):
    with caplog.at_level(logging.WARNING):
        _, config, _, _ = read_nanochat_checkpoint(checkpoint(generation_base, "aa530cd"))
    assert not caplog.records and config.residual_lambdas and set(config.layer_types) == {"full_attention"}


def test_a_short_window_covering_the_context_is_full_attention(write_generation, tmp_path):
    """G5 at sequence_len 256: nanochat's short window is 128 keys; at 128 it would be 128 >= 127: full."""
    write_generation(tmp_path / "base_checkpoints" / "d3", "a825e63")
    meta_path = tmp_path / "base_checkpoints" / "d3" / f"meta_{STEP:06d}.json"
    meta = json.loads(meta_path.read_text())
    for seq, types in ((256, ["sliding_attention"] * 2 + ["full_attention"]), (128, ["full_attention"] * 3)):
        meta["model_config"]["sequence_len"] = seq
        meta_path.write_text(json.dumps(meta))
        _, config, _, _ = read_nanochat_checkpoint(tmp_path / "base_checkpoints" / "d3")
        assert config.layer_types == types and config.sliding_window == (129 if seq == 256 else None)


# ------------------------------------------------------------------------------------------------- refusals


def _edit_state(ckpt: Path, edit) -> None:
    path = ckpt / f"model_{STEP:06d}.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_model_config(ckpt: Path, **changes) -> None:
    path = ckpt / f"meta_{STEP:06d}.json"
    meta = json.loads(path.read_text())
    meta["model_config"].update(changes)
    path.write_text(json.dumps(meta))


def _rename(state: dict, old: str, new: str) -> None:
    state[new] = state.pop(old)


BAD = {  # name: (commit, how to break the copy, file named, words of the message)
    "bigram experiment": (
        "a91743c",
        lambda c: _edit_state(
            c,
            lambda s: s.update(
                {"_orig_mod.bigram_embed.embed.weight": torch.zeros(4, 64), "_orig_mod.bigram_lambdas": torch.zeros(3)}
            ),
        ),
        "model_000005.pt",
        ["bigram_embed.embed.weight", "bigram_lambdas", "reverted"],
    ),
    "window_pattern with G0 keys": (
        "bc51da8",
        lambda c: _edit_model_config(c, window_pattern="SSSL"),
        "meta_000005.json",
        ["window_pattern", "resid_lambdas"],
    ),
    "bad window_pattern": (
        "a825e63",
        lambda c: _edit_model_config(c, window_pattern="SXL"),
        "meta_000005.json",
        ["window_pattern", "'SXL'"],
    ),
    "unknown meta field": ("a825e63", lambda c: _edit_model_config(c, n_bigram=3), "meta_000005.json", ["n_bigram"]),
    "meta layers contradict keys": (
        "a825e63",
        lambda c: _edit_model_config(c, n_layer=4),
        "model_000005.pt",
        ["layer 0", "[1, 3]"],
    ),
    "value embedding on the wrong layer": (
        "a91743c",
        lambda c: _edit_state(
            c, lambda s: _rename(s, "_orig_mod.value_embeds.2.weight", "_orig_mod.value_embeds.1.weight")
        ),
        "model_000005.pt",
        ["value_embeds.1.weight", "layer 1", "[0, 2]"],
    ),
    "ve_gate width of no generation": (
        "6ed7d1d",
        lambda c: _edit_state(
            c,
            lambda s: s.update(
                {f"_orig_mod.transformer.h.{i}.attn.ve_gate.weight": torch.zeros(2, 20) for i in (0, 2)}
            ),
        ),
        "model_000005.pt",
        ["ve_gate.weight", "(2, 20)"],
    ),
    "half of G1's scalars": (
        "aa530cd",
        lambda c: _edit_state(c, lambda s: s.pop("_orig_mod.x0_lambdas")),
        "model_000005.pt",
        ["resid_lambdas", "x0_lambdas"],
    ),
    "smear without backout": (
        "a825e63",
        lambda c: _edit_state(c, lambda s: s.pop("_orig_mod.backout_lambda")),
        "model_000005.pt",
        ["backout_lambda"],
    ),
    "smear on a G3 model": (
        "a91743c",
        lambda c: _edit_state(
            c,
            lambda s: s.update(
                {
                    "_orig_mod.smear_gate.weight": torch.zeros(1, 24),
                    "_orig_mod.smear_lambda": torch.zeros(1),
                    "_orig_mod.backout_lambda": torch.zeros(1),
                }
            ),
        ),
        "model_000005.pt",
        ["smear", "32 channels"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_is_refused_in_one_line(generation_base, tmp_path, case):
    commit, breaker, named, words = BAD[case]
    ckpt = shutil.copytree(checkpoint(generation_base, commit), tmp_path / "base_checkpoints" / commit)
    breaker(ckpt)
    out = tmp_path / "hf"
    with pytest.raises(UserError) as info:
        from_nanochat(ckpt, out, generation_base / "tokenizer", trust_pickle=True)
    message = str(info.value)
    assert "\n" not in message and named in message and all(w in message for w in words), message
    assert not out.exists()


@pytest.fixture(scope="module")
def g5_hf(generation_base, tmp_path_factory) -> Path:
    return from_nanochat(
        checkpoint(generation_base, "a825e63"),
        tmp_path_factory.mktemp("g5") / "hf",
        generation_base / "tokenizer",
        trust_pickle=True,
    )


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sliding_window": 600}, ["config.json", "sliding_window 600", "larger than sequence_len 512"]),
        ({"sliding_window": 200}, ["config.json", "sliding_window 200", "G5", "128"]),
        ({"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}, ["config.json", "last layer"]),
        ({"smear": False}, ["config.json", "no nanochat generation", "backout=True"]),
        ({"qk_scale": 1.3}, ["config.json", "no nanochat generation", "qk_scale=1.3"]),
    ],
)
def test_a_model_nanochat_cannot_build_is_not_written(g5_hf, tmp_path, change, words):
    model = shutil.copytree(g5_hf, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config.update(change)
    (model / "config.json").write_text(json.dumps(config))
    if "smear" in change:  # the weights of a model without smear
        state = load_file(model / "model.safetensors")
        save_file({k: v for k, v in state.items() if "smear" not in k}, model / "model.safetensors")
    out = tmp_path / "nanochat" / "base_checkpoints" / "d3"
    with pytest.raises(UserError) as info:
        to_nanochat(model, out)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert not out.exists() and not (tmp_path / "nanochat" / "tokenizer").exists()


def test_to_native_exports_g0_and_refuses_later_generations(generation_base, g5_hf, tmp_path):
    with pytest.raises(UserError) as info:
        to_native(g5_hf, tmp_path / "native")
    message = str(info.value)
    assert "\n" not in message and "G5" in message and "NanoChatForCausalLM" in message
    assert all(
        w in message
        for w in ("resid/x0 lambdas", "sliding-window", "value embeddings", "q/k scale", "smear", "backout")
    )
    assert not (tmp_path / "native").exists()
    # G0 with nanochat's padded vocabulary (bc51da8): the padding rows, never looked up, are dropped
    hf = from_nanochat(
        checkpoint(generation_base, "bc51da8"), tmp_path / "hf", generation_base / "tokenizer", trust_pickle=True
    )
    native = load_file(to_native(hf, tmp_path / "native") / "model.safetensors")
    padded = load_file(hf / "model.safetensors")
    assert native["model.embed_tokens.weight"].shape == (300, 64)
    assert torch.equal(native["lm_head.weight"], padded["lm_head.weight"][:300])
