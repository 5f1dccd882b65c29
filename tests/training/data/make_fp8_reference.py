"""Reference of nanochat HEAD's fp8 training (nanochat/fp8.py and scripts/base_train.py at 92d63d4), executed on CPU;
see README.md.

1. HEAD's `Float8Linear` (tensorwise, the one recipe it implements), forward and backward of a 48 x 64 layer on a
   2 x 8 x 64 input with a given output gradient, with COMPUTE_DTYPE bfloat16 (what HEAD computes in on an H100)
   and float32: the input, weight and output gradient, and the output and both gradients it returns
   (`torch._scaled_mm` has float8 CPU kernels in torch 2.13).
2. Which linear layers HEAD's base_train converts: its `fp8_module_filter` (extracted from the script with ast, as
   it is written) and `convert_to_float8_training` on HEAD's GPT (built on meta) of two small configs.
3. What HEAD says for `--fp8-recipe rowwise`: the error of `Float8LinearConfig.from_recipe_name("rowwise")`.

Usage: python make_fp8_reference.py <nanochat tree>   (e.g. a copy of HEAD's tree; writes next to this file)
"""

import ast
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent
CONFIGS = {  # HEAD's GPTConfig: one with every large layer divisible by 16, one (136 wide) with none
    "d2_w128": dict(sequence_len=64, vocab_size=300, n_layer=2, n_head=1, n_kv_head=1, n_embd=128),
    "d1_w136": dict(sequence_len=64, vocab_size=300, n_layer=1, n_head=2, n_kv_head=2, n_embd=136),
}


def layer_case(fp8, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    grad_out = torch.randn(*x.shape[:-1], weight.shape[0], generator=torch.Generator().manual_seed(1)) * 1e-3
    fp8.COMPUTE_DTYPE = dtype  # HEAD reads it at import (NANOCHAT_DTYPE); the layer casts its input to it
    layer = fp8.Float8Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = nn.Parameter(weight.clone())
    xin = x.clone().requires_grad_(True)
    out = layer(xin)
    out.backward(grad_out.to(dtype))
    return {"grad_out": grad_out.to(dtype), "out": out.detach(), "grad_x": xin.grad, "grad_weight": layer.weight.grad}


def head_filter(nc: Path):
    """`fp8_module_filter` as base_train.py defines it (nested under `if args.fp8:`)."""
    tree = ast.parse((nc / "scripts" / "base_train.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "fp8_module_filter")
    scope = {"nn": nn}
    exec(compile(ast.Module([fn], []), "base_train.py", "exec"), scope)
    return scope["fp8_module_filter"]


def main(nc: Path) -> None:
    sys.path.insert(0, str(nc))
    import nanochat.fp8 as fp8
    from nanochat.gpt import GPT, GPTConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 64, generator=g)
    x[0, 3, 7] = 40.0  # an outlier sets the input's scale
    weight = torch.randn(48, 64, generator=g) * 0.05
    tensors = {"x": x, "weight": weight}
    for dtype in (torch.bfloat16, torch.float32):
        for k, v in layer_case(fp8, x, weight, dtype).items():
            tensors[f"{str(dtype).split('.')[1]}.{k}"] = v.contiguous()
    save_file(tensors, OUT / "fp8_reference.safetensors")

    keep = head_filter(nc)
    converted = {}
    for name, kw in CONFIGS.items():
        with torch.device("meta"):
            model = GPT(GPTConfig(window_pattern="L", **kw))
        linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        fp8.convert_to_float8_training(model, config=fp8.Float8LinearConfig.from_recipe_name("tensorwise"),
                                       module_filter_fn=keep)  # fmt: skip
        fp8_layers = [n for n, m in model.named_modules() if "Float8" in type(m).__name__]
        converted[name] = {"config": kw, "linear": linear, "converted": fp8_layers}
    try:
        fp8.Float8LinearConfig.from_recipe_name("rowwise")
        rowwise = None
    except ValueError as e:
        rowwise = str(e)
    reference = {"torch": torch.__version__, "converted": converted, "rowwise_error": rowwise}
    (OUT / "fp8_reference.json").write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
