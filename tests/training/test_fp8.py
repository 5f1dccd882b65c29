"""fp8 training (`--fp8`, training/fp8.py) against nanochat HEAD's nanochat/fp8.py and base_train.py executing
(tests/training/data/fp8_reference.*, made by make_fp8_reference.py on CPU: torch._scaled_mm has float8 CPU kernels):
the layer's forward and backward bit for bit, the layers converted, a step in fp8 saving an ordinary folder that
evaluates without fp8, and the one line off H100-class GPUs or for HEAD's missing rowwise recipe."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nanochat_hf.conversion.generations import BY_NAME
from nanochat_hf.errors import UserError
from nanochat_hf.model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.training import base_arguments, base_run
from nanochat_hf.training.base_arguments import parse_base_args
from nanochat_hf.training.fp8 import Fp8Linear, check_fp8, convert_to_fp8

from .base_replay import DATA

REF = json.loads((DATA / "fp8_reference.json").read_text())
TENSORS = load_file(DATA / "fp8_reference.safetensors")
OFF_GPU = (
    "base_train: error: fp8=true needs an H100-class GPU (CUDA, compute capability 8.9+ for torch._scaled_mm's "
    "float8 matmuls), this device is cpu: drop --fp8"
)


def g5(config: dict) -> NanoChatGPTForCausalLM:
    """Our model of one of HEAD's GPTConfigs (window pattern L)."""
    return NanoChatGPTForCausalLM(NanoChatGPTConfig(pad_vocab_size_to=64, **config, **BY_NAME["G5"].fields))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_layer_forward_and_backward_equal_heads_bit_for_bit(dtype):
    """HEAD casts the input to its COMPUTE_DTYPE (bf16 on an H100); ours to autocast's, which the Trainer turns on."""
    layer = Fp8Linear(64, 48, bias=False)
    layer.weight.data.copy_(TENSORS["weight"])
    x = TENSORS["x"].clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        out = layer(x)
    out.backward(TENSORS[f"{dtype}.grad_out"])
    for name, ours in (("out", out.detach()), ("grad_x", x.grad), ("grad_weight", layer.weight.grad)):
        assert torch.equal(ours, TENSORS[f"{dtype}.{name}"]), name


@pytest.mark.parametrize("name", sorted(REF["converted"]))
def test_the_layers_heads_filter_converts(name):
    """HEAD's base_train converts the linear layers with sizes multiples of 16 and at least 128: here the same ones
    (a 128-wide model: every attention and MLP matrix and lm_head, not the gates; 136 wide: none)."""
    ref = REF["converted"][name]
    model = g5(ref["config"])
    line = convert_to_fp8(model)
    converted = [n for n, m in model.named_modules() if isinstance(m, Fp8Linear)]
    assert converted == ref["converted"]
    assert model.lm_head.zero_init  # the same modules, their attributes kept
    n, total = len(ref["converted"]), len(ref["linear"])
    assert (
        line
        == f"fp8 training (tensorwise scaling): converted {n}/{total} linear layers, skipped {total - n} (too small)"
    )


def test_a_step_in_fp8_saves_an_ordinary_folder_that_evaluates_without_fp8(tmp_path):
    config = {"sequence_len": 32, "vocab_size": 64, "n_layer": 1, "n_head": 1, "n_kv_head": 1, "n_embd": 128}
    torch.manual_seed(0)
    plain = g5(config)
    for p in plain.parameters():  # every matrix random (nanochat's init zeroes the projections)
        if p.ndim == 2:
            p.data.normal_(0, 0.05)
    model = g5(config)
    model.load_state_dict(plain.state_dict())
    convert_to_fp8(model)
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    for m in (plain, model):  # float32 compute (bf16 is the layer test's; CPU bf16 matmuls are slow)
        m(input_ids=ids, labels=ids).loss.backward()
    fc = "transformer.h.0.mlp.c_fc.weight"
    assert not torch.equal(model.get_parameter(fc).grad, plain.get_parameter(fc).grad)  # the float8 matmuls ran
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.save_pretrained(tmp_path)
    assert sorted(load_file(tmp_path / "model.safetensors")) == sorted(plain.state_dict())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not any(isinstance(m, Fp8Linear) for m in loaded.modules())
    # evaluation (eval mode, or no autograd) multiplies as nn.Linear: HEAD's disable_fp8 around its evaluations
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    model.eval()
    assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_off_h100_class_gpus_fp8_is_one_line(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        base_run.main(["--fp8=true", "--use_cpu=true", "--output_dir=/nonexistent"])
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [OFF_GPU]
    # on CUDA: compute capability 8.9 and later (what torch._scaled_mm's float8 kernels need)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    for capability, ok in (((8, 0), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        if ok:
            check_fp8("tensorwise", torch.device("cuda"))
            continue
        with pytest.raises(UserError, match=r"this device is NVIDIA A100-SXM4-80GB \(compute capability 8\.0\)"):
            check_fp8("tensorwise", torch.device("cuda"))


def test_rowwise_is_refused_as_head_refuses_it():
    assert REF["rowwise_error"].startswith("Only 'tensorwise' recipe is supported, got 'rowwise'")  # HEAD raises
    with pytest.raises(UserError, match=r"^fp8_recipe=rowwise: HEAD's fp8 .* has only the tensorwise recipe"):
        parse_base_args(["--fp8=true", "--fp8_recipe=rowwise", "--use_cpu=true"])
    parse_base_args(["--fp8_recipe=rowwise", "--use_cpu=true"])  # without --fp8, ignored as in HEAD


def test_fp8_with_sharded_weights_is_refused(monkeypatch):
    monkeypatch.setattr(base_arguments, "check_fp8", lambda recipe, device: None)  # as on an H100
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # accelerate launch with an FSDP config
    with pytest.raises(UserError, match=r"^fp8=true with FSDP \(fully_shard, --fsdp or an Accelerate FSDP config\)"):
        parse_base_args(["--fp8=true", "--use_cpu=true"])


@pytest.mark.slow
def test_base_train_in_fp8_trains_evaluates_and_saves(tmp_path, monkeypatch):
    """The script with --fp8 (its device check passed over: no GPU here): the conversion's line, steps, val bpb,
    and a folder that loads as an ordinary model."""
    from nanochat_hf.data.pretraining import write_synthetic_shards

    monkeypatch.setattr(base_arguments, "check_fp8", lambda recipe, device: None)
    write_synthetic_shards(tmp_path / "shards", 3, 40, row_group_size=20)
    out, stdout = tmp_path / "run", io.StringIO()
    argv = [
        "--fp8=true", "--depth=1", "--aspect_ratio=128", "--head_dim=128", "--max_seq_len=32", "--window_pattern=L",
        "--device_batch_size=2", "--total_batch_size=64", "--num_iterations=2", "--eval_every=2",
        "--eval_tokens=64", "--core_metric_every=-1", "--sample_every=-1", "--torch_compile=false",
        "--disable_tqdm=true", "--num_threads=1", "--use_cpu=true", "--data_dir", str(tmp_path / "shards"),
        "--tokenizer_dir", str(DATA / "base_train_tokenizer"), "--output_dir", str(out),
    ]  # fmt: skip
    with contextlib.redirect_stdout(stdout):
        base_run.main(argv)
    assert "base_train: fp8 training (tensorwise scaling): converted 7/9 linear layers" in stdout.getvalue()
    assert "validation bpb: " in stdout.getvalue()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
