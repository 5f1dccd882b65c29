"""By hand, not in the suite: in bfloat16, our G5 model (rotary_dtype "compute", under bf16 autocast) against
nanochat HEAD's forward running bfloat16 (NANOCHAT_DTYPE=bfloat16: COMPUTE_DTYPE bf16, its rotary tables bf16).

    git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc
    PYTHONPATH=/tmp/nc:src python tests/conversion/data/check_bf16_with_nanochat.py

Weights: chat_sft.py's result of tests/training/data/chain (G5, depth 4, sequence 256, "SSSL"), token embedding and
value embeddings in bf16 as nanochat keeps them in COMPUTE_DTYPE; 2 x 200 seeded ids. Result on 2026-11-27, torch
2.13 CPU (AMD EPYC Zen 5, native bf16): "compute" max |ours - nanochat| 0.0; float32 tables 0.029 (mean 0.0018).
A bf16 comparison depends on the CPU's bf16 kernels, hence a check by hand rather than a test.
"""

import os
from pathlib import Path

os.environ["NANOCHAT_DTYPE"] = "bfloat16"
import torch  # noqa: E402
from nanochat.gpt import GPT, GPTConfig  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM  # noqa: E402
from nanochat_hf.conversion.generations import BY_NAME, hf_names, layer_windows  # noqa: E402

CHAIN = Path(__file__).resolve().parents[2] / "training" / "data" / "chain"
CONFIG = {"sequence_len": 256, "vocab_size": 512, "n_layer": 4, "n_head": 2, "n_kv_head": 2, "n_embd": 32}

torch.set_num_threads(1)
weights = load_file(str(CHAIN / "nanochat_sft.safetensors"))
nanochat = GPT(GPTConfig(**CONFIG, window_pattern="SSSL"))
nanochat.init_weights()
nanochat.load_state_dict({k: v.to(nanochat.state_dict()[k].dtype) for k, v in weights.items()})
ids = torch.randint(0, CONFIG["vocab_size"], (2, 200), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    expected = nanochat.eval()(ids).float()
layer_types, window = layer_windows(BY_NAME["G5"], "SSSL", CONFIG["sequence_len"], CONFIG["n_layer"])
for rotary in ("compute", "float32"):
    fields = {**BY_NAME["G5"].fields, "rotary_dtype": rotary}
    config = NanoChatGPTConfig(**CONFIG, **fields, pad_vocab_size_to=64, layer_types=layer_types, sliding_window=window)
    ours = NanoChatGPTForCausalLM(config).eval()
    names = hf_names(config)
    ours.load_state_dict({names[k]: v for k, v in weights.items()})
    ours.transformer.wte.to(torch.bfloat16)
    for embedding in ours.transformer.value_embeds.values():
        embedding.to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        diff = (ours(ids).logits.float() - expected).abs()
    print(f"rotary_dtype {rotary}: max |ours - nanochat bf16| {diff.max().item():.3g}, mean {diff.mean().item():.3g}")
