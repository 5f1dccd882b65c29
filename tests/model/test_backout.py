"""backout_lambda (G5) against nanochat HEAD executing (data/backout/, made by make_backout_reference.py there).

With backout after block n_layer // 2 and the final RMSNorm right after it, a model of depth 2 (or 1) subtracts
backout_lambda times the LAST block's output from itself: norm((1 - lambda) * x) = norm(x) for lambda < 1, so the
loss does not depend on backout_lambda and its gradient is float32 rounding (nanochat's own: 4e-9). AdamW turns any
gradient far above its eps 1e-10 into steps of about lr (0.2 for the smear group): there, backout_lambda follows the
rounding, and nanochat's own run in two float orders ends 2% apart where every other tensor agrees to 3e-6. From
depth 3 the gradient is real, and ours equals nanochat's."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.conversion.generations import BY_NAME, hf_names, nanochat_shapes

REFERENCE = json.loads((Path(__file__).parent / "data" / "backout" / "backout_reference.json").read_text())


def model_and_batch(depth: int) -> tuple[NanoChatGPTForCausalLM, torch.Tensor, torch.Tensor]:
    """The reference script's model and batch: the same weights, drawn in nanochat's state-dict order."""
    config = NanoChatGPTConfig(**REFERENCE["config"], n_layer=depth, **BY_NAME["G5"].fields, pad_vocab_size_to=64)
    model = NanoChatGPTForCausalLM(config)
    names, params = hf_names(config), dict(model.named_parameters())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, shape in nanochat_shapes(config).items():
            scale, offset = (0.5, 0.0) if len(shape) == 2 else (0.1, 1.0 if name == "resid_lambdas" else 0.0)
            params[names[name]].copy_(torch.randn(shape, generator=g) * scale + offset)
        model.transformer.backout_lambda.fill_(-1.75)
    idx = torch.randint(0, config.vocab_size, (2, config.sequence_len + 1), generator=g)
    return model, idx[:, :-1], idx[:, 1:]


def loss_of(model: NanoChatGPTForCausalLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


@pytest.mark.parametrize("depth", [2, 4])
def test_backout_gradient_is_nanochats(depth):
    ref = REFERENCE["depths"][str(depth)]
    model, x, y = model_and_batch(depth)
    loss = loss_of(model, x, y)
    loss.backward()
    grad = model.transformer.backout_lambda.grad.item()
    assert loss.item() == pytest.approx(ref["loss"], rel=1e-6)
    largest = max(p.grad.abs().max().item() for n, p in model.named_parameters() if "backout" not in n)
    if depth == 4:
        assert grad == pytest.approx(ref["backout_grad"], rel=1e-5)
        return
    # depth 2: rounding in both (nanochat's and ours far below every real gradient), float64 rounding in float64
    assert abs(grad) < 1e-6 * largest and abs(ref["backout_grad"]) < 1e-6 * largest
    model = model.double()
    model.zero_grad()
    loss_of(model, x, y).backward()
    assert abs(model.transformer.backout_lambda.grad.item()) < 1e-15 * largest
    with torch.no_grad():  # and the loss does not move with it (lambda < 1)
        model.transformer.backout_lambda.fill_(0.5)
        assert loss_of(model, x, y).item() == pytest.approx(loss.item(), rel=1e-6)
    # nanochat's own run in two float orders: backout_lambda apart by orders more than every other tensor
    spread = ref["two_float_orders"]
    a, b = spread["backout_lambda"]
    assert abs(a - b) / abs(a) > 1e3 * spread["others_max_rel"]
