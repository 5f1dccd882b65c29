"""The per-tensor math of nanochat's optimizers (spec section 6), free of any distribution logic."""

from __future__ import annotations

import torch
from torch import Tensor

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(g: Tensor, steps: int = 5) -> Tensor:
    """Quintic Newton-Schulz orthogonalisation in bfloat16.

    ``g`` is one matrix (r, c) or a stack of same-shaped matrices (n, r, c); every matrix of the stack is
    processed independently with batched matmuls. Returns bfloat16 of the same shape.
    """
    a, b, c = NS_COEFFS
    x = g.bfloat16()
    squeeze = x.ndim == 2
    if squeeze:
        x = x.unsqueeze(0)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide orientation: the Gram matrix X X^T is then the small one
        x = x.mT
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + NS_EPS)
    for _ in range(steps):
        gram = torch.bmm(x, x.mT)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b*A + c*A@A
        x = torch.baddbmm(x, poly, x, beta=a)  # a*X + B@X
    if tall:
        x = x.mT
    return x.squeeze(0) if squeeze else x


def muon_lr_scale(shape: torch.Size | tuple[int, ...]) -> float:
    """nanochat's aspect-ratio factor max(1, rows/cols)^0.5."""
    return max(1.0, shape[-2] / shape[-1]) ** 0.5


def muon_update(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *, lr: float,
                momentum: float, nesterov: bool, ns_steps: int) -> None:
    """One Muon step for same-shaped matrices: momentum (float32 buffers), one batched Newton-Schulz, update."""
    if not params:
        return
    grads = [g.float() for g in grads]
    torch._foreach_lerp_(bufs, grads, 1.0 - momentum)
    # the Nesterov blend (float32) is rounded straight into the bf16 stack that Newton-Schulz consumes,
    # instead of stacking in float32 and casting the stack: one full-size float32 pass fewer
    stack = torch.empty((len(params), *params[0].shape), dtype=torch.bfloat16, device=params[0].device)
    for g, buf, out in zip(grads, bufs, stack.unbind(0)):
        out.copy_(torch.lerp(g, buf, momentum) if nesterov else buf)
    ortho = newton_schulz(stack, ns_steps)
    step = -lr * muon_lr_scale(params[0].shape)
    for p, o in zip(params, ortho.unbind(0)):
        p.add_(o, alpha=step)


def adamw_update(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, step: int, lr: float,
                 betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """AdamW on ``p`` (any float dtype, may be a view) with float32 moments and float32 arithmetic.

    Written out instead of calling torch.optim's functional adamw because that one keeps the moments in the
    parameter's dtype (bfloat16 moments for bfloat16 params) and needs tensor step counters. Bias corrections are
    Python floats, so nothing is promoted to float64 (which MPS refuses). eps is added after the bias-corrected
    square root, like torch's AdamW: p -= lr/bc1 * m / (sqrt(v/bc2) + eps).
    """
    beta1, beta2 = betas
    g = g.float()
    p32 = p.float()  # p itself when p is float32
    if weight_decay:
        p32.mul_(1.0 - lr * weight_decay)
    exp_avg.lerp_(g, 1.0 - beta1)
    exp_avg_sq.lerp_(g.square(), 1.0 - beta2)
    bc1 = 1.0 - beta1**step
    bc2 = 1.0 - beta2**step
    denom = (exp_avg_sq / bc2).sqrt_().add_(eps)
    p32.addcdiv_(exp_avg, denom, value=-lr / bc1)
    if p32.data_ptr() != p.data_ptr():
        p.copy_(p32)
