"""A G0-era optimizer file for tests/optim/test_optimizer_files.py: nanochat 790f3be, one process, 3 steps.

Run from a `git archive 790f3be` extraction: TORCHDYNAMO_DISABLE=1 PYTHONPATH=g0 python make_g0_optim.py OUT
"""

import sys

import torch
from nanochat.gpt import GPT, GPTConfig

torch.manual_seed(0)
model = GPT(GPTConfig(sequence_len=16, vocab_size=64, n_layer=3, n_head=2, n_kv_head=1, n_embd=32))
model.init_weights()
g = torch.Generator().manual_seed(2)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)
optimizers = model.setup_optimizers()
for step in range(3):
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    for opt in optimizers:
        opt.step()
# what base_train.py saves as optim_<step>_rank0.pt: [AdamW state_dict, Muon state_dict]
torch.save([opt.state_dict() for opt in optimizers], sys.argv[1] + "/optim_000003_rank0.pt")
print([(n, tuple(p.shape)) for n, p in model.named_parameters()])
print(optimizers[1].state_dict()["param_groups"])
