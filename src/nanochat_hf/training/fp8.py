"""fp8 training as nanochat HEAD's base_train.py does it (`--fp8`, 92d63d4: nanochat/fp8.py and the script's lines
that use it): the matmuls of the large linear layers in float8, with one dynamic scale per tensor ("tensorwise").

Each of a layer's three matmuls (the output, the input's gradient, the weight's gradient) quantizes its two operands
to float8 with the scale fp8_max / max|tensor| and multiplies them with `torch._scaled_mm`, which takes the inverse
scales to undo them: input and weight as float8_e4m3fn (more mantissa), the output's gradient as float8_e5m2 (more
range); the forward accumulates fast, the backward exactly. The weights stay as they are (float32 master weights,
their state dict names unchanged): only the matmul changes, so a saved folder is an ordinary one.

Only training passes use float8: a layer in eval mode or under no_grad multiplies as the nn.Linear it was. That is
where HEAD swaps its layers back (`disable_fp8`: validation bpb, CORE, samples), so they run in bf16 as in HEAD.

HEAD's filter converts the linear layers whose sizes are multiples of 16 (the float8 kernels' requirement) and at
least 128 on both sides (smaller ones gain nothing): in today's GPT every attention and MLP matrix and lm_head, not
the value-embedding and smear gates. `torch._scaled_mm` needs CUDA compute capability 8.9+ (Ada, Hopper).

Why not torchao: HEAD does not use it (base_train.py imports nanochat/fp8.py; torchao's import is commented out), and
torchao's numbers are not HEAD's where it matters: torchao 0.18's tensorwise Float8Linear on the stored reference
(tests/training/data/fp8_reference.*, CPU) equals HEAD's bit for bit in float32 compute, but under bf16 autocast
(how the Trainer trains) its output differs by up to 0.039 and its weight gradient by up to 8.5e-4 (the input gradient
is equal). torchao is not a dependency here either; this module is HEAD's recipe in a few lines, checked against
HEAD's executing (tests/training/test_fp8.py). HEAD's module has no rowwise recipe (it raises, saying rowwise needs
torchao): neither has this one, and `--fp8_recipe rowwise` is refused.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserError

MIN_CAPABILITY = (8, 9)  # torch._scaled_mm's float8 kernels: Ada (8.9), Hopper (9.0) and later
RECIPES = ("tensorwise",)  # HEAD's nanochat/fp8.py implements this one only
EPS = 1e-12  # the smallest amax a scale divides by (an all-zero tensor)


def check_fp8(recipe: str, device: torch.device) -> None:
    """UserError unless HEAD's fp8 can run here: its recipe, on a CUDA GPU of compute capability 8.9+."""
    if recipe not in RECIPES:
        raise UserError(
            f"fp8_recipe={recipe}: HEAD's fp8 (nanochat/fp8.py) has only the tensorwise recipe (its rowwise needs "
            "torchao, which HEAD does not use): use --fp8_recipe tensorwise"
        )
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY:
        return
    found = device.type
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        found = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    raise UserError(
        f"fp8=true needs an H100-class GPU (CUDA, compute capability 8.9+ for torch._scaled_mm's float8 matmuls), "
        f"this device is {found}: drop --fp8"
    )


@torch.no_grad()
def _quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x in float8 scaled to fill its range, and the inverse scale `_scaled_mm` multiplies back. The scale is
    divided in float64 (as HEAD and torchao: compiled and eager code then agree); out-of-range values saturate."""
    top = torch.finfo(dtype).max
    scale = (top / x.float().abs().max().double().clamp(min=EPS)).float()
    return (x.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def _column_major(x: torch.Tensor) -> torch.Tensor:
    """The same matrix stored column by column: `_scaled_mm` wants its second operand so."""
    return x.t().contiguous().t()


@torch._dynamo.allow_in_graph  # one opaque node for torch.compile, as HEAD's
class _Fp8Matmul(torch.autograd.Function):
    """out = x @ weight.T (x 2-D), its three matmuls in float8."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x8, x_inv = _quantize(x, torch.float8_e4m3fn)
        w8, w_inv = _quantize(weight, torch.float8_e4m3fn)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        # w8.t() is already column-major
        return torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype, use_fast_accum=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = _quantize(grad, torch.float8_e5m2)
        grad_x = torch._scaled_mm(
            g8, _column_major(w8), scale_a=g_inv, scale_b=w_inv, out_dtype=grad.dtype, use_fast_accum=False
        )
        grad_w = torch._scaled_mm(
            g8.t().contiguous(), _column_major(x8), scale_a=g_inv, scale_b=x_inv, out_dtype=grad.dtype,
            use_fast_accum=False,
        )  # fmt: skip
        return grad_x, grad_w


class Fp8Linear(nn.Linear):
    """An nn.Linear whose training passes multiply in float8 (see the module's docstring); no state of its own, so
    `convert_to_fp8` turns a layer into one by its class."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        device = x.device.type
        # HEAD casts the input to its compute dtype: here autocast's when it is on (bf16 on CUDA), else x's own
        if torch.is_autocast_enabled(device):
            x = x.to(torch.get_autocast_dtype(device))
        with torch.autocast(device, enabled=False):
            out = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias.to(out.dtype)


def converts(linear: nn.Linear) -> bool:
    """HEAD's `fp8_module_filter`: sizes multiples of 16, at least 128 both ways."""
    sizes = (linear.in_features, linear.out_features)
    return all(n % 16 == 0 for n in sizes) and min(sizes) >= 128


def convert_to_fp8(model: nn.Module, recipe: str = "tensorwise") -> str:
    """Every linear layer HEAD converts becomes an Fp8Linear in place (before the Trainer wraps or compiles the
    model): the same module, parameters and attributes, only its class changes; returns the line HEAD prints."""
    if recipe not in RECIPES:
        raise UserError(f"fp8_recipe={recipe}: expected one of {', '.join(RECIPES)}")
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for m in linear:
        if converts(m):
            m.__class__ = Fp8Linear
    done = sum(isinstance(m, Fp8Linear) for m in linear)
    total = len(linear)
    return (
        f"fp8 training ({recipe} scaling): converted {done}/{total} linear layers, skipped {total - done} (too small)"
    )
