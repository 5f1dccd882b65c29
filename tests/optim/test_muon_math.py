import pytest
import torch

from nanochat_hf.optim import adamw_update, build_optimizer, newton_schulz

SHAPES = [(64, 64), (256, 64), (64, 256), (32, 64)]


def _rel(u, v):
    return ((u.double() - v.double()).norm() / v.double().norm()).item()


@pytest.mark.parametrize("shape", SHAPES)
def test_newton_schulz_matches_spec_reference_within_bf16(helpers, shape):
    """Our fused bf16 iteration vs the documented one-op-at-a-time bf16 iteration: they differ by bf16 rounding only,
    i.e. about as much as the reference itself differs from exact (float64) arithmetic, and ours is no farther
    from exact than the reference is."""
    torch.manual_seed(0)
    g = torch.randn(3, *shape)
    ours = newton_schulz(g)
    ref = torch.stack([helpers.ref_newton_schulz(x) for x in g])
    exact = torch.stack([helpers.ref_newton_schulz(x, torch.float64) for x in g])
    assert ours.dtype == torch.bfloat16 and ours.shape == g.shape
    ref_err = _rel(ref, exact)
    assert ref_err < 0.05  # sanity: the bf16 reference is a few percent from exact
    assert _rel(ours, ref) <= 1.5 * ref_err
    assert _rel(ours, exact) <= ref_err
    # orthogonalised: all singular values below ~1.2 and nearly all above 0.5 (a Gaussian matrix's spread
    # widely; only the very smallest are not lifted in 5 steps)
    s = torch.linalg.svdvals(ours.float())
    assert s.max() < 1.3 and (s > 0.5).float().mean() > 0.9


@pytest.mark.parametrize("shape", SHAPES)
def test_batched_equals_one_at_a_time(shape):
    torch.manual_seed(1)
    g = torch.randn(5, *shape)
    batched = newton_schulz(g)
    single = torch.stack([newton_schulz(x) for x in g])
    assert torch.equal(batched, single)


def test_muon_steps_match_spec_reference(helpers):
    """Three optimizer steps on every block matrix vs the documented Muon step (docs/nanochat.md) applied one matrix
    at a time."""
    model = helpers.tiny_model(n_layer=2)
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}
    bufs = {n: torch.zeros_like(p) for n, p in ref.items()}
    opt = build_optimizer(model, matrix_lr=0.05, polar_dtype="bfloat16")  # the spec step orthogonalises in bf16
    torch.manual_seed(2)
    largest_update = 0.0
    for step in range(3):
        momentum = 0.85 + 0.05 * step
        opt.set_muon_momentum(momentum)
        for n, p in model.named_parameters():
            p.grad = torch.randn_like(p)
            if n.startswith("transformer.h."):
                before = ref[n].clone()
                helpers.ref_muon_step(ref[n], p.grad, bufs[n], 0.05, momentum)
                largest_update = max(largest_update, (ref[n] - before).abs().max().item())
        opt.step()
    for n, p in model.named_parameters():
        if n.startswith("transformer.h."):
            # per step each entry may differ by bf16 rounding of the update (<< the update itself)
            assert (p.detach() - ref[n]).abs().max() <= 0.15 * largest_update, n
            assert torch.allclose(opt.state[p]["momentum_buffer"], bufs[n], rtol=1e-6, atol=1e-7), n


def test_muon_aspect_ratio_lr_scale():
    """A tall matrix moves sqrt(rows/cols) times farther per step than a wide one with the same lr."""
    tall = torch.nn.Parameter(torch.zeros(256, 64))
    wide = torch.nn.Parameter(torch.zeros(64, 256))
    opt = build_optimizer(_Holder(tall, wide), matrix_lr=0.01)
    torch.manual_seed(3)
    g = torch.randn(256, 64)
    tall.grad, wide.grad = g.clone(), g.T.clone()
    opt.step()
    # identical gradients up to transpose: identical orthogonalised updates up to transpose, then lr x 2 vs x 1
    assert torch.allclose(tall.detach(), 2 * wide.detach().T, rtol=0, atol=1e-6)


class _Holder(torch.nn.Module):
    """Two block matrices under transformer.h, the names build_optimizer routes to Muon."""

    def __init__(self, *mats):
        super().__init__()
        self.config = type("Cfg", (), {"n_embd": 64})()
        self.transformer = torch.nn.Module()
        self.transformer.h = torch.nn.ParameterList(mats)


def _reference_adamw(p, grads, lr, betas, eps, wd):
    """Spec section 6 AdamW in float64: decoupled decay, bias-corrected moments."""
    p = p.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.double()
        p *= 1 - lr * wd
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p -= lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_float32_math_for_any_param_dtype(dtype):
    torch.manual_seed(4)
    p0 = torch.randn(8, 16)
    grads = [torch.randn(8, 16) * 1e-3 for _ in range(4)]
    p = p0.clone().to(dtype)
    m = torch.zeros(8, 16)
    v = torch.zeros(8, 16)
    for t, g in enumerate(grads, 1):
        adamw_update(p, g.to(dtype), m, v, step=t, lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)
    assert m.dtype == v.dtype == torch.float32 and p.dtype == dtype
    if dtype == torch.float32:
        ref = _reference_adamw(p0, grads, 0.01, (0.8, 0.95), 1e-10, 0.1)
        assert torch.allclose(p.double(), ref, rtol=0, atol=1e-6)
    else:  # bf16: each step is the float32 step rounded once to bf16, so stay within a few bf16 ulps
        ref = _reference_adamw(
            p0.bfloat16().float(), [g.bfloat16().float() for g in grads], 0.01, (0.8, 0.95), 1e-10, 0.1
        )
        assert (p.double() - ref).abs().max() <= 4 * 2**-8 * ref.abs().max()


def test_batching_paths_are_bit_identical(helpers):
    """Per-matrix, chunked and whole-stack Newton-Schulz, and whole optimizer steps on each path, agree exactly."""
    from nanochat_hf.optim import ns_batch_size

    torch.manual_seed(5)
    g = torch.randn(5, 48, 160)
    whole = newton_schulz(g, batch_size=0)
    for size in (1, 2, None):
        assert torch.equal(newton_schulz(g, batch_size=size), whole)
    data = helpers.batches(2, 1)
    finals = []
    for size in (0, 1, 2):
        model = helpers.tiny_model(n_layer=2)
        opt = build_optimizer(model)
        opt.set_newton_schulz(batch_size=size)
        for step in range(2):
            helpers.loss_backward(model, data[step][0])
            opt.step()
            opt.zero_grad()
        finals.append(helpers.flat_params(model))
    assert torch.equal(finals[0], finals[1]) and torch.equal(finals[0], finals[2])
    # the default: whole stack on accelerators, one at a time for large matrices on CPU, batched for small ones
    assert ns_batch_size(torch.device("cuda"), (768, 768)) == 0
    assert ns_batch_size(torch.device("cpu"), (768, 768)) == 1
    assert ns_batch_size(torch.device("cpu"), (3072, 768)) == 1
    assert ns_batch_size(torch.device("cpu"), (256, 256)) == 0


@pytest.mark.parametrize("shape", [(64, 256), (512, 96), (96, 300)])
def test_gram_newton_schulz_is_the_same_polynomial(helpers, shape):
    """The Gram iteration: in float64 the standard result; in float32 within 1e-4; in bfloat16 a different
    rounding (not equal) that stays within 3x the standard iteration's own distance from exact arithmetic."""
    torch.manual_seed(6)
    g = torch.randn(3, *shape)
    exact = newton_schulz(g, dtype=torch.float64)
    assert _rel(newton_schulz(g, gram=True, dtype=torch.float64), exact) < 1e-10
    assert _rel(newton_schulz(g, gram=True, dtype=torch.float32), newton_schulz(g, dtype=torch.float32)) < 1e-4
    std, gram = newton_schulz(g), newton_schulz(g, gram=True)
    assert gram.dtype == torch.bfloat16 and gram.shape == g.shape
    assert not torch.equal(gram, std)  # the Gram path really ran
    assert _rel(gram, exact) <= 3 * _rel(std, exact) and _rel(gram, exact) < 0.05
    assert (gram.double() - std.double()).abs().max() < 0.03
    s = torch.linalg.svdvals(gram.float())
    assert s.max() < 1.3 and (s > 0.5).float().mean() > 0.9


def test_gram_leaves_square_matrices_and_is_off_by_default(helpers):
    torch.manual_seed(7)
    g = torch.randn(2, 64, 80)  # aspect 1.25 < 1.5: the standard iteration is cheaper, so it is used
    assert torch.equal(newton_schulz(g, gram=True), newton_schulz(g))
    model = helpers.tiny_model(n_layer=1)
    opt = build_optimizer(model)
    assert all(not g.get("ns_gram", False) for g in opt.param_groups)
    opt.set_newton_schulz(gram=True)
    assert [g.get("ns_gram") for g in opt.param_groups if g["kind"] == "muon"] == [True]
