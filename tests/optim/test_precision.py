"""The orthogonalisation's dtype (optim/precision.py): "auto" follows the CPU's bfloat16 arithmetic, a pinned
bfloat16 is the December recipe's step on every CPU, a device that cannot multiply bfloat16 is refused in one line.

A CPU without native bfloat16 (AVX2 only) is reproduced in-process with oneDNN off: torch then emulates bfloat16
matrix products, 40-70x slower than float32, as it does on such CPUs."""

from pathlib import Path

import pytest
import torch

from nanochat_hf.errors import UserError
from nanochat_hf.optim import RECIPES, MuonAdamW, build_optimizer, resolve_polar_dtype


def _muon_dtypes(opt):
    return {g["polar_dtype"] for g in opt.param_groups if g["kind"] == "muon"}


def _cpu_flags() -> set[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


def test_auto_is_float32_where_bfloat16_is_emulated(emulated_bfloat16, helpers):
    dtype, reason = resolve_polar_dtype("auto", "cpu", "2025-12")
    assert dtype == torch.float32 and "emulated" in reason, reason
    assert resolve_polar_dtype("auto", "cpu", "2026-07")[0] == torch.float32
    for recipe in RECIPES:
        assert _muon_dtypes(build_optimizer(helpers.tiny_model(n_layer=1), recipe=recipe)) == {"float32"}
        pinned = build_optimizer(helpers.tiny_model(n_layer=1), recipe=recipe, polar_dtype="bfloat16")
        assert _muon_dtypes(pinned) == {"bfloat16"}


def test_auto_is_bfloat16_where_the_cpu_multiplies_it_natively(helpers):
    if not _cpu_flags() & {"avx512_bf16", "amx_bf16"}:
        pytest.skip("this CPU has no native bfloat16 matrix products (avx512_bf16 / amx_bf16)")
    dtype, reason = resolve_polar_dtype("auto", "cpu", "2025-12")
    assert dtype == torch.bfloat16 and "native" in reason, reason
    assert _muon_dtypes(build_optimizer(helpers.tiny_model(n_layer=1))) == {"bfloat16"}
    # recipe 2026-07 keeps nanochat HEAD's compute dtype off CUDA: float32
    assert _muon_dtypes(build_optimizer(helpers.tiny_model(n_layer=1), recipe="2026-07")) == {"float32"}


def test_pinned_bfloat16_is_the_december_step_where_auto_is_not(emulated_bfloat16, helpers):
    """On a CPU that emulates bfloat16, pinning it gives the December recipe's step bit for bit (the step every run
    took before polar_dtype existed: Muon groups without the key orthogonalise in bfloat16); auto's float32 step
    is a different, equally close approximation of the same update."""

    def three_steps(polar_dtype):
        model = helpers.tiny_model(n_layer=2)
        opt = build_optimizer(model, matrix_lr=0.05, polar_dtype=polar_dtype or "bfloat16")
        if polar_dtype is None:  # the December step as it was: no polar_dtype key
            groups = [{k: v for k, v in g.items() if k != "polar_dtype"} for g in opt.param_groups]
            opt = MuonAdamW(groups)
        torch.manual_seed(2)
        for _ in range(3):
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            opt.step()
        return {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("transformer.h.")}

    december, pinned, auto = three_steps(None), three_steps("bfloat16"), three_steps("auto")
    assert all(torch.equal(pinned[n], december[n]) for n in december)
    assert not all(torch.equal(auto[n], december[n]) for n in december)
    start = {n: p for n, p in helpers.tiny_model(n_layer=2).named_parameters() if n in december}
    for n in december:  # the float32 update differs from the bf16 one by its rounding only
        step = (december[n] - start[n]).abs().max()
        assert (auto[n] - december[n]).abs().max() <= 0.15 * step, n


def test_a_pinned_bfloat16_the_device_cannot_run_is_one_line(helpers, no_bfloat16_products):
    model = helpers.tiny_model(n_layer=1)
    with no_bfloat16_products, pytest.raises(UserError) as e:
        build_optimizer(model, polar_dtype="bfloat16")
    assert str(e.value) == (
        "polar_dtype=bfloat16: cpu cannot multiply bfloat16 matrices (bfloat16 matmul is not supported on this "
        "device); use auto or float32"
    )
    with pytest.raises(UserError, match=r"polar_dtype='float16': expected one of auto, bfloat16, float32"):
        build_optimizer(model, polar_dtype="float16")


@pytest.mark.parametrize(
    ("capability", "expected"), [((9, 0), torch.bfloat16), ((8, 0), torch.bfloat16), ((7, 5), torch.float32)]
)
def test_auto_on_cuda_follows_nanochat_heads_sm80_rule(monkeypatch, capability, expected):
    """bfloat16 from Ampere (SM 8.0) on, float32 before (V100, T4), in both recipes, as nanochat HEAD's compute
    dtype; torch.cuda.is_bf16_supported() would say True on a T4 (emulation included)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    for recipe in RECIPES:
        dtype, reason = resolve_polar_dtype("auto", torch.device("cuda", 0), recipe)
        assert dtype == expected and f"SM {capability[0]}{capability[1]}" in reason
