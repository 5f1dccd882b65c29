"""A fake nanochat base directory: base_checkpoints/d2/model_<step>.pt + meta_<step>.json and a tiktoken
tokenizer (tokenizer.pkl + token_bytes.pt), written as nanochat writes them; and one checkpoint of each nanochat
model generation (G0-G5), with the tensor names, order and shapes nanochat's own GPT has at that generation's commit
(data/nanochat_generations.json, made by data/make_nanochat_reference.py from nanochat's code)."""

from __future__ import annotations

import json
import pickle
import re
from collections import Counter
from pathlib import Path

import pytest
import tiktoken
import torch

from nanochat_hf.tokenizer import SPECIAL_TOKENS, SPLIT_PATTERN

DATA = Path(__file__).parent / "data"
# the December 2025 fixture below (G0, vocabulary not padded: nanochat before bc51da8)
MODEL_CONFIG = {"sequence_len": 64, "vocab_size": 300, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64}
STEP = 5
TEXT = (
    "the quick brown fox jumps over the lazy dog. then the other fox thinks that the dog is there, "
    "and they both hunt the thin thread of their thoughts with three thousand theses."
) * 3


def learn_ranks(text: str, n_merges: int) -> dict[bytes, int]:
    """Tiny byte-level BPE: the 256 bytes, then the most frequent adjacent pair merged, n_merges times."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in w.encode()] for w in re.findall(r" ?\w+|\S", text)]
    for _ in range(n_merges):
        pairs = Counter((a, b) for w in words for a, b in zip(w, w[1:]))
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks[a + b] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i : i + 2] = [a + b]
                i += 1
    return ranks


def make_encoding(vocab_size: int) -> tiktoken.Encoding:
    ranks = learn_ranks(TEXT, vocab_size - 256 - len(SPECIAL_TOKENS))
    specials = {tok: len(ranks) + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(
        name="fake-nanochat", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def write_tokenizer(directory: Path, vocab_size: int) -> tiktoken.Encoding:
    directory.mkdir(parents=True, exist_ok=True)
    enc = make_encoding(vocab_size)
    with open(directory / "tokenizer.pkl", "wb") as f:
        pickle.dump(enc, f)
    special_ids = set(enc._special_tokens.values())
    # tok_train.py's counts: UTF-8 length of the DECODED token (a lone byte 0x80-0xFF decodes to U+FFFD: 3 bytes)
    lengths = [0 if i in special_ids else len(enc.decode([i]).encode("utf-8")) for i in range(enc.n_vocab)]
    torch.save(torch.tensor(lengths, dtype=torch.int32), directory / "token_bytes.pt")
    return enc


def fake_state_dict(model_config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under nanochat's names, as a torch.compile'd CUDA run saves them: `_orig_mod.` prefix,
    bf16 embedding, float32 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    d, v, L = model_config["n_embd"], model_config["vocab_size"], model_config["n_layer"]
    kv = model_config["n_kv_head"] * d // model_config["n_head"]
    shapes = {"transformer.wte.weight": (v, d), "lm_head.weight": (v, d)}
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes.update(
            {
                p + "attn.c_q.weight": (d, d),
                p + "attn.c_k.weight": (kv, d),
                p + "attn.c_v.weight": (kv, d),
                p + "attn.c_proj.weight": (d, d),
                p + "mlp.c_fc.weight": (4 * d, d),
                p + "mlp.c_proj.weight": (d, 4 * d),
            }
        )
    sd = {k: torch.randn(s, generator=g) * (1.0 if "wte" in k else 0.1) for k, s in shapes.items()}
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"].to(torch.bfloat16)
    return {f"_orig_mod.{k}": t for k, t in sd.items()}


def write_checkpoint(checkpoint_dir: Path, step: int, state_dict: dict, model_config: dict) -> None:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torch.save(state_dict, checkpoint_dir / f"model_{step:06d}.pt")
    meta = {"step": step, "val_bpb": 1.23, "model_config": model_config, "user_config": {"run": "fake"}}
    (checkpoint_dir / f"meta_{step:06d}.json").write_text(json.dumps(meta))


# ------------------------------------------------------------------ one checkpoint per generation (G0 to G5)

# nanochat commit -> generation: the first commit of each (G2: b33e394 and fbc1484 differ only in a default)
GENERATION_COMMITS = {
    "790f3be": "G0",
    "bc51da8": "G0",
    "aa530cd": "G1",
    "fbc1484": "G2",
    "b33e394": "G2",
    "a91743c": "G3",
    "6ed7d1d": "G4",
    "a825e63": "G5",
}
# long enough for real sliding windows at every generation (short window 256 for G2-G4, 128 for G5); 3 layers put
# value embeddings on layers 0 and 2, and "SSSL" gives layers S, S, L
GENERATION_CONFIG = {"sequence_len": 512, "vocab_size": 300, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 64}
WINDOW_PATTERN = "SSSL"
REFERENCE_IDS = [(7 * i * i + 3 * i + 11) % 300 for i in range(300)]  # longer than every short window
REFERENCE_POSITIONS = [0, 1, 2, 127, 128, 129, 200, 255, 256, 257, 258, 299]  # rows kept of nanochat's logits
_OFFSETS = {"resid_lambdas": 1.0, "x0_lambdas": 0.1, "smear_lambda": 0.5, "backout_lambda": 0.2}


def random_weights(shapes: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for nanochat's tensors (names in its order), stored as a CUDA run of nanochat stores them:
    wte and value embeddings bf16, everything else fp32 (nanochat/gpt.py init_weights)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in shapes.items():
        t = torch.randn(shape, generator=g)
        embedding = key == "transformer.wte.weight" or key.startswith("value_embeds.")
        out[key] = t.to(torch.bfloat16) if embedding else t * 0.1 + _OFFSETS.get(key, 0.0)
    return out


def nanochat_reference() -> dict:
    """commit -> {generation, model_config keys, tensors (name -> shape, nanochat's order), window_sizes}."""
    return json.loads((DATA / "nanochat_generations.json").read_text())["commits"]


def write_generation_checkpoint(
    checkpoint_dir: Path,
    commit: str,
    step: int = STEP,
    *,
    window_pattern: bool = True,
    orig_mod: bool = True,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """model_<step>.pt + meta_<step>.json as nanochat at `commit` writes them (``_orig_mod.`` names when `orig_mod`,
    as a torch.compile'd model saves them; nanochat's loader strips them); `window_pattern=False` leaves it out of the
    meta, as SFT metas before 8b4849d. Returns the state dict (names without the prefix)."""
    entry = nanochat_reference()[commit]
    state = random_weights(entry["tensors"], seed)
    model_config = {k: GENERATION_CONFIG[k] for k in GENERATION_CONFIG}
    if "window_pattern" in entry["model_config"] and window_pattern:
        model_config["window_pattern"] = WINDOW_PATTERN
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torch.save(
        {("_orig_mod." if orig_mod else "") + k: v for k, v in state.items()}, checkpoint_dir / f"model_{step:06d}.pt"
    )
    meta = {
        "step": step,
        "val_bpb": 1.23,
        "model_config": model_config,
        "user_config": {"run": "fake"},
        "device_batch_size": 4,
        "max_seq_len": GENERATION_CONFIG["sequence_len"],
    }
    (checkpoint_dir / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2))
    return state


@pytest.fixture(scope="session")
def write_generation():
    """write_generation_checkpoint, for tests that build their own nanochat folders."""
    return write_generation_checkpoint


@pytest.fixture(scope="session")
def generation_base(tmp_path_factory) -> Path:
    """<base>/tokenizer and <base>/base_checkpoints/<commit>/ for every commit of GENERATION_COMMITS."""
    base = tmp_path_factory.mktemp("generations")
    write_tokenizer(base / "tokenizer", GENERATION_CONFIG["vocab_size"])
    for commit in GENERATION_COMMITS:
        write_generation_checkpoint(base / "base_checkpoints" / commit, commit)
    return base


@pytest.fixture(scope="session")
def nanochat_base(tmp_path_factory) -> Path:
    """<base>/tokenizer and <base>/base_checkpoints/d2 with steps 2 and 5 (5, the latest, is the one used)."""
    base = tmp_path_factory.mktemp("nanochat_base")
    write_tokenizer(base / "tokenizer", MODEL_CONFIG["vocab_size"])
    ckpt = base / "base_checkpoints" / "d2"
    write_checkpoint(ckpt, 2, fake_state_dict(MODEL_CONFIG, seed=1), MODEL_CONFIG)
    write_checkpoint(ckpt, STEP, fake_state_dict(MODEL_CONFIG, seed=0), MODEL_CONFIG)
    return base


@pytest.fixture(scope="session")
def hf_dir(nanochat_base, tmp_path_factory) -> Path:
    from nanochat_hf.conversion import from_nanochat

    out = tmp_path_factory.mktemp("converted") / "hf"
    return from_nanochat(nanochat_base / "base_checkpoints" / "d2", out, nanochat_base / "tokenizer", trust_pickle=True)
