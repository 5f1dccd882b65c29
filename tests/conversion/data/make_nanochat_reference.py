"""Writes nanochat_generations.json and nanochat_logits.pt (this folder) from nanochat's own code; run by hand.

    python tests/conversion/data/make_nanochat_reference.py NANOCHAT_TREES

NANOCHAT_TREES holds one checkout per commit, ``<NANOCHAT_TREES>/nc_<commit>/nanochat/...`` (e.g. made with
``git archive <commit> nanochat | tar -x -C <NANOCHAT_TREES>/nc_<commit>``). For each commit (one per generation,
plus bc51da8 for G0 with the padded vocabulary) it builds nanochat's ``GPT`` for the config of
``conftest.GENERATION_CONFIG`` on the meta device and records its state-dict names and shapes (nanochat's order), then
fills the checkpoint conftest's ``random_weights`` writes (seed 0) into a CPU float32 ``GPT`` with
``load_state_dict(strict=True)`` and records the logits of ``REFERENCE_IDS`` (the rows of ``REFERENCE_POSITIONS``).
Float32 on CPU: ``NANOCHAT_DTYPE=float32``; commits fbc1484/b33e394 import FlashAttention 3 from ``kernels``, which is
replaced by nanochat's own SDPA fallback of a91743c (``nanochat/flash_attention.py``). Run with torch 2.13 (CPU).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from dataclasses import fields
from pathlib import Path

os.environ.setdefault("NANOCHAT_DTYPE", "float32")
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import (  # noqa: E402
    GENERATION_COMMITS,
    GENERATION_CONFIG,
    REFERENCE_IDS,
    REFERENCE_POSITIONS,
    WINDOW_PATTERN,
    random_weights,
)


def load_nanochat(tree: Path, sdpa_tree: Path) -> types.ModuleType:
    for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "a91743c_flash_attention", sdpa_tree / "nanochat" / "flash_attention.py"
    )
    sdpa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sdpa)
    sys.modules["kernels"] = types.SimpleNamespace(
        get_kernel=lambda name: types.SimpleNamespace(flash_attn_interface=sdpa.flash_attn)
    )
    sys.path.insert(0, str(tree))
    try:
        return importlib.import_module("nanochat.gpt")
    finally:
        sys.path.remove(str(tree))


def main(trees: Path) -> None:
    table, logits = {}, {}
    for commit, generation in GENERATION_COMMITS.items():
        gpt = load_nanochat(trees / f"nc_{commit}", trees / "nc_a91743c")
        kwargs = dict(GENERATION_CONFIG)
        has_windows = "window_pattern" in {f.name for f in fields(gpt.GPTConfig)}
        if has_windows:
            kwargs["window_pattern"] = WINDOW_PATTERN
        with torch.device("meta"):
            meta_model = gpt.GPT(gpt.GPTConfig(**kwargs))
        shapes = {k: list(v.shape) for k, v in meta_model.state_dict().items()}
        model = gpt.GPT(gpt.GPTConfig(**kwargs))
        model.init_weights()  # the rotary tables, as nanochat's checkpoint_manager.build_model does
        state = {k: v.float() for k, v in random_weights(shapes, seed=0).items()}
        model.load_state_dict(state, strict=True, assign=True)
        model.eval()
        with torch.no_grad():
            out = model(torch.tensor([REFERENCE_IDS]))
        logits[commit] = out[0, REFERENCE_POSITIONS].float().clone()
        table[commit] = {
            "generation": generation,
            "model_config": sorted(kwargs),
            "tensors": shapes,
            "window_sizes": [list(w) for w in getattr(model, "window_sizes", [])],
        }
        print(commit, generation, len(shapes), "tensors", flush=True)
    reference = {
        "config": GENERATION_CONFIG,
        "window_pattern": WINDOW_PATTERN,
        "ids": REFERENCE_IDS,
        "positions": REFERENCE_POSITIONS,
        "commits": table,
    }
    (HERE / "nanochat_generations.json").write_text(json.dumps(reference, indent=1) + "\n")
    torch.save(logits, HERE / "nanochat_logits.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
