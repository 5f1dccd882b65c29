"""By hand, not in the suite: nanochat's own loader (checkpoint_manager.build_model, strict=True) at each commit
loads what our to-nanochat writes for that generation, and its logits equal nanochat_logits.pt.

    python tests/conversion/data/check_with_nanochat_loader.py write OUT              # our code (PYTHONPATH=src)
    cd NANOCHAT_TREES/nc_<commit> && NANOCHAT_BASE_DIR=OUT/<commit> NANOCHAT_DTYPE=float32 PYTHONPATH=. \
        python .../check_with_nanochat_loader.py load <commit> NANOCHAT_TREES             # nanochat's code

`write` converts each fixture checkpoint (conftest.write_generation_checkpoint) with from_nanochat, then to_nanochat
into OUT/<commit>/base_checkpoints/d3 (tokenizer in OUT/<commit>/tokenizer: nanochat's layout). `load` runs in
nanochat's tree (NANOCHAT_TREES as in make_nanochat_reference.py; FlashAttention 3 replaced by nanochat's SDPA
fallback of a91743c, rustbpe, only needed to train a tokenizer, stubbed). Result on 2026-11-25, torch 2.13 CPU:
every commit of conftest.GENERATION_COMMITS and HEAD 92d63d4 (on the G5 output) loads, max |logits - reference| 0.0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def write(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("fixtures", HERE.parent / "conftest.py")
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    from nanochat_hf.conversion import from_nanochat, to_nanochat

    fixtures.write_tokenizer(out / "src" / "tokenizer", fixtures.GENERATION_CONFIG["vocab_size"])
    for commit in fixtures.GENERATION_COMMITS:
        source = out / "src" / "base_checkpoints" / commit
        fixtures.write_generation_checkpoint(source, commit)
        hf = from_nanochat(source, out / "hf" / commit, out / "src" / "tokenizer", trust_pickle=True)
        to_nanochat(hf, out / commit / "base_checkpoints" / "d3")


def load(commit: str, trees: Path) -> None:
    spec = importlib.util.spec_from_file_location("sdpa", trees / "nc_a91743c" / "nanochat" / "flash_attention.py")
    sdpa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sdpa)
    sys.modules["kernels"] = types.SimpleNamespace(
        get_kernel=lambda name: types.SimpleNamespace(flash_attn_interface=sdpa.flash_attn)
    )
    sys.modules["rustbpe"] = types.ModuleType("rustbpe")
    from nanochat.checkpoint_manager import build_model

    base = Path(os.environ["NANOCHAT_BASE_DIR"])
    model, tokenizer, meta = build_model(str(base / "base_checkpoints" / "d3"), 5, torch.device("cpu"), "eval")
    reference = json.loads((HERE / "nanochat_generations.json").read_text())
    expected = torch.load(HERE / "nanochat_logits.pt", weights_only=True)[base.name]
    with torch.no_grad():
        logits = model(torch.tensor([reference["ids"]]))[0, reference["positions"]].float()
    print(
        commit,
        base.name,
        "loaded (strict=True), vocab",
        tokenizer.get_vocab_size(),
        meta["model_config"],
        "max |logits - reference|",
        (logits - expected).abs().max().item(),
    )


if __name__ == "__main__":
    write(Path(sys.argv[2])) if sys.argv[1] == "write" else load(sys.argv[2], Path(sys.argv[3]))
