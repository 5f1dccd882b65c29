"""The per-tensor math of nanochat's optimizers (docs/nanochat.md, section 6), free of any distribution logic."""

from __future__ import annotations

import torch
from torch import Tensor

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
# Gram Newton-Schulz pays 2*m^2*n twice (Gram matrix, final product) plus about 8*m^3 per iteration, the standard
# one 4*m^2*n + 2*m^3 per iteration: with 5 iterations it needs fewer FLOPs once n > 1.5 m.
GRAM_MIN_ASPECT = 1.5
# On CPU a matrix with min(r, c)^2 * max(r, c) at least this big is orthogonalised on its own (see ns_batch_size)
CPU_PER_MATRIX_MIN_WORK = 2**28


def _orthogonalise(x: Tensor, coeffs: list[tuple[float, float, float]]) -> Tensor:
    """The standard iteration on a stack (n, m, k) of wide (m <= k), normalised matrices, one (a, b, c) per step:
    X <- a X + (b A + c A^2) X with A = X X^T (Newton-Schulz repeats one triple, Polar Express changes it)."""
    for a, b, c in coeffs:
        gram = torch.bmm(x, x.mT)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b*A + c*A@A
        x = torch.baddbmm(x, poly, x, beta=a)  # a*X + B@X
    return x


def _orthogonalise_gram(x: Tensor, steps: int) -> Tensor:
    """The same polynomial iterated on the small Gram matrix: X_k = Q_k X_0 with A_k = X_k X_k^T.

    Each iteration is X <- P X with P = a I + b A + c A^2 a polynomial in A, so A <- P A P and Q <- P Q, all
    m x m products; X_0 (m x k) is touched only twice. Exact arithmetic gives the standard result; in low precision
    the rounding of A and Q compounds over the iterations (see benchmarks/optim_step.py for the measured deviation).
    """
    a, b, c = NS_COEFFS
    gram = torch.bmm(x, x.mT)
    q = None
    for i in range(steps):
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        poly.diagonal(dim1=-2, dim2=-1).add_(a)  # P = a I + b A + c A^2
        q = poly if q is None else torch.bmm(poly, q)
        if i + 1 < steps:
            gram = torch.bmm(poly, torch.bmm(gram, poly))
    return torch.bmm(q, x)


def _newton_schulz_chunk(x: Tensor, steps: int, gram: bool) -> Tensor:
    """Normalise and orthogonalise a stack of wide matrices (every one independently)."""
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + NS_EPS)
    if gram and x.size(-1) >= GRAM_MIN_ASPECT * x.size(-2):
        return _orthogonalise_gram(x, steps)
    return _orthogonalise(x, [NS_COEFFS] * steps)


def ns_batch_size(device: torch.device, shape: tuple[int, ...]) -> int:
    """How many same-shaped matrices one batched Newton-Schulz matmul should cover (0: all of them)."""
    if device.type != "cpu":
        return 0  # accelerators: one launch per product for the whole stack
    # CPU: batching saves per-call overhead, which only matters for small matrices; for large ones one matmul
    # already keeps both cores busy, and a matrix at a time keeps its products in cache (measured on 2 cores: a
    # batch of 768 x 768 matrices was up to 1.4x slower than looping, batches of 256 x 256 ones 2x faster).
    m, k = min(shape[-2:]), max(shape[-2:])
    return 1 if m * m * k >= CPU_PER_MATRIX_MIN_WORK else 0


def newton_schulz(
    g: Tensor, steps: int = 5, *, batch_size: int | None = None, gram: bool = False, dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """Quintic Newton-Schulz orthogonalisation, by default in bfloat16.

    ``g`` is one matrix (r, c) or a stack of same-shaped matrices (n, r, c); every matrix is processed
    independently, ``batch_size`` of them per batched matmul (0: the whole stack; None: chosen by
    :func:`ns_batch_size`). The result does not depend on the batching. ``gram=True`` iterates on the Gram
    matrix for matrices at least GRAM_MIN_ASPECT times wider than tall (or taller than wide): fewer FLOPs, same
    polynomial, different rounding. Returns ``dtype`` of the input's shape.
    """
    x = g.to(dtype)
    squeeze = x.ndim == 2
    if squeeze:
        x = x.unsqueeze(0)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide orientation: the Gram matrix X X^T is then the small one
        x = x.mT
    if batch_size is None:
        batch_size = ns_batch_size(x.device, tuple(x.shape[1:]))
    if batch_size <= 0 or batch_size >= x.size(0):
        x = _newton_schulz_chunk(x, steps, gram)
    else:
        x = torch.cat([_newton_schulz_chunk(part, steps, gram) for part in x.split(batch_size)])
    if tall:
        x = x.mT
    return x.squeeze(0) if squeeze else x


def muon_lr_scale(shape: torch.Size | tuple[int, ...]) -> float:
    """nanochat's aspect-ratio factor max(1, rows/cols)^0.5."""
    return max(1.0, shape[-2] / shape[-1]) ** 0.5


def muon_update(
    params: list[Tensor],
    grads: list[Tensor],
    bufs: list[Tensor],
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    batch_size: int | None = None,
    gram: bool = False,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """One Muon step for same-shaped matrices: momentum (float32 buffers), Newton-Schulz in ``dtype``, update.

    ``batch_size`` matrices (0: all; None: :func:`ns_batch_size`) go through momentum blend, Newton-Schulz and
    update together, so that on the per-matrix path each matrix's data stays in cache from start to end.
    ``gram`` selects the Gram iteration for rectangular matrices (see :func:`newton_schulz`). ``dtype``: nanochat's
    December bfloat16 by default (see optim/precision.py for where float32 is faster).
    """
    if not params:
        return
    grads = [g.float() for g in grads]
    torch._foreach_lerp_(bufs, grads, 1.0 - momentum)
    if batch_size is None:
        batch_size = ns_batch_size(params[0].device, tuple(params[0].shape))
    batch_size = batch_size if 0 < batch_size < len(params) else len(params)
    step = -lr * muon_lr_scale(params[0].shape)
    for i0 in range(0, len(params), batch_size):
        chunk = slice(i0, i0 + batch_size)
        # the Nesterov blend (float32) is rounded straight into the stack that Newton-Schulz consumes, instead of
        # stacking in float32 and casting the stack: one full-size float32 pass fewer in bfloat16
        stack = torch.empty((len(params[chunk]), *params[0].shape), dtype=dtype, device=params[0].device)
        for g, buf, out in zip(grads[chunk], bufs[chunk], stack.unbind(0)):
            out.copy_(torch.lerp(g, buf, momentum) if nesterov else buf)
        ortho = newton_schulz(stack, ns_steps, batch_size=0, gram=gram, dtype=dtype)
        for p, o in zip(params[chunk], ortho.unbind(0)):
            p.add_(o, alpha=step)


def adamw_update(
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
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


# ---- nanochat HEAD's Muon step (92d63d4, nanochat/optim.py muon_step_fused), recipe "2026-07" ------------------------
# Polar Express coefficients, one triple per iteration (computed for 5 iterations, safety factor 2e-2, cushion 2;
# Amsel et al. 2025, arXiv 2505.16932), as nanochat's optim.py lists them.
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def _f32(value: float) -> float:
    """``value`` rounded to float32: nanochat passes hyperparameters as float32 0-D tensors, so ``1 - beta`` and
    ``lr * wd`` are float32 arithmetic there (a difference or product of two float32 numbers is exact in float64,
    so rounding it once gives float32's result)."""
    return torch.tensor(value, dtype=torch.float32).item()


def polar_express(x: Tensor, steps: int = 5) -> Tensor:
    """Orthogonalise a stack (n, r, c) in x's dtype the way nanochat HEAD does: MuonEq row equilibration (every row
    rescaled to the mean row norm), normalisation by 1.01 * ||X||_F + 1e-6, then ``steps`` Polar Express iterations
    (the Newton-Schulz polynomial of the December recipe with per-iteration coefficients; tall matrices iterate on
    X^T X, as nanochat does)."""
    xf = x.float()
    target = xf.norm(dim=(-2, -1), keepdim=True) / (x.size(-2) ** 0.5)
    row_norm = xf.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    x = x * (target / row_norm).to(x.dtype)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
    # nanochat's own sequence of products (not _orthogonalise's fused baddbmm): the same values in exact arithmetic,
    # and the same rounding as nanochat on every CPU (fused alpha/beta products round differently on some BLAS)
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        if x.size(-2) > x.size(-1):
            gram = x.mT @ x
            x = a * x + x @ (b * gram + c * (gram @ gram))
        else:
            gram = x @ x.mT
            x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x


def normuon_update(
    params: list[Tensor],
    grads: Tensor,
    momentum_buffer: Tensor,
    second_momentum_buffer: Tensor,
    *,
    lr: float,
    momentum: float,
    beta2: float,
    weight_decay: float,
    ns_steps: int,
    dtype: torch.dtype,
) -> None:
    """One step of nanochat HEAD's Muon for a stack of same-shaped matrices ``params`` (n of them).

    ``grads`` (n, r, c) is consumed; ``momentum_buffer`` (n, r, c) and ``second_momentum_buffer`` (n, r, 1) for
    r >= c, else (n, 1, c), are float32. Nesterov momentum; orthogonalisation in ``dtype`` (nanochat: bfloat16 when
    its compute dtype is, else float32) by :func:`polar_express`; Muon+ rescale to Frobenius norm sqrt(min(r, c));
    NorMuon variance reduction (second moment of the update along the larger dimension, overall norm kept);
    cautious weight decay ``p -= lr*g + lr*wd*p*[g*p >= 0]`` with lr scaled by :func:`muon_lr_scale`.
    """
    if not params:
        return
    p = torch.stack(params)
    grads = grads.float()
    momentum_buffer.lerp_(grads, _f32(1 - _f32(momentum)))
    g = grads.lerp_(momentum_buffer, _f32(momentum))
    g = polar_express(g.to(dtype), ns_steps).to(p.dtype)
    # Muon+: the norm of an exactly semi-orthogonal matrix, correcting the polar iteration's under-convergence
    rows, cols = g.shape[-2:]
    g = g * (min(rows, cols) ** 0.5 / g.float().norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)).to(g.dtype)
    # NorMuon: per-row (r >= c) or per-column second moment, then the overall norm restored
    red_dim = -1 if rows >= cols else -2
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    size = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * size).sqrt()
    second_momentum_buffer.lerp_(v_mean, _f32(1 - _f32(beta2)))
    step_size = second_momentum_buffer.clamp_min(1e-10).rsqrt()
    v_norm_new = ((v_mean * size) * step_size.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    g = g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)
    # cautious weight decay: decay only where the update and the weight agree in sign
    step = _f32(lr * muon_lr_scale(p.shape))
    decay = _f32(step * _f32(weight_decay))  # exact in float64, so this is float32's product
    p.sub_(step * g + decay * p * ((g * p) >= 0))
    torch._foreach_copy_(params, list(p.unbind(0)))
