"""Reference for tests/optim/test_head_recipe.py: nanochat HEAD (92d63d4) GPT.setup_optimizer + MuonAdamW, 5 steps.

Run from a `git archive 92d63d4` extraction:
    NANOCHAT_DTYPE=float32 TORCHDYNAMO_DISABLE=1 PYTHONPATH=nc python this.py OUT
torch.compile is disabled (TORCHDYNAMO_DISABLE=1): nanochat's fused functions run eagerly, op by op.
"""

import sys

import torch
from nanochat.gpt import GPT, GPTConfig
from safetensors.torch import save_file

torch.manual_seed(0)
config = GPTConfig(sequence_len=16, vocab_size=64, n_layer=3, n_head=2, n_kv_head=1, n_embd=32, window_pattern="SSL")
model = GPT(config)
model.init_weights()
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for p in model.parameters():  # every weight random (a fresh model zeroes projections and scalars)
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)
out = {}
opt = model.setup_optimizer(unembedding_lr=0.004, embedding_lr=0.3, matrix_lr=0.02, weight_decay=0.2, scalar_lr=0.5)
for step in range(5):
    for n, p in model.named_parameters():
        p.grad = torch.randn(p.shape, generator=g)
    lrm = 1.0 - 0.1 * step
    for group in opt.param_groups:
        group["lr"] = group["initial_lr"] * lrm
        if group["kind"] == "muon":
            group["momentum"] = 0.85 + 0.02 * step
    opt.step()
out.update({f"final/{n}": p.detach().clone() for n, p in model.named_parameters()})
sd = opt.state_dict()
for i, st in sd["state"].items():
    for k, v in st.items():
        if torch.is_tensor(v):
            out[f"state/{i}/{k}"] = v.clone()
torch.save(sd, sys.argv[1] + "/optim_000005_rank0.pt")  # a real HEAD optimizer file, for the warm-start tests
names = [n for n, _ in model.named_parameters()]
save_file(
    {k: v.contiguous() for k, v in out.items()},
    sys.argv[1] + "/head_reference.safetensors",
    metadata={"names": " ".join(names)},
)
print([(n, tuple(p.shape)) for n, p in model.named_parameters()])
print([(gr["kind"], len(gr["params"]), gr["lr"]) for gr in opt.param_groups])
