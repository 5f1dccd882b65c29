"""What nanochat does on CUDA, shown on CPU: a bfloat16 token embedding (forced here, under CPU bf16 autocast) and
pinned, non-blocking host-to-device copies (chosen only for CUDA; the CPU path is the plain one)."""

import contextlib
import io
import json
import math
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nanochat_hf.training.arguments import parse_args
from nanochat_hf.training.device import pins_for, to_device
from nanochat_hf.training.run import build_trainer, setup, train

pytestmark = pytest.mark.slow

# bf16 matmuls are slow on CPUs without bf16 units: 2 steps of one micro-batch, one evaluation at the end
BASE = [
    "--num_iterations",
    "2",
    "--save_steps",
    "1",
    "--eval_every",
    "0",
    "--total_batch_size",
    "128",
    "--eval_tokens",
    "128",
    "--dtype",
    "bfloat16",
]


def _run(argv: list[str], evaluate_first: bool = False):
    """setup, build_trainer and train as mid_train does (its final sample chat would take longest here)."""
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = build_trainer(*setup(argv))
        if evaluate_first:  # before train() has prepared the model: evaluate autocasts by itself
            assert math.isfinite(trainer.evaluate()["eval_val_bpb"])
        train(trainer)
    return trainer


def _losses(checkpoint) -> list:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"]) for h in history if "lrm" in h]


def _dtypes(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny bf16-autocast run with a bfloat16 and a float32 embedding."""
    from .conftest import TINY_ARGS

    tmp = tmp_path_factory.mktemp("cuda_ready")
    args = [*TINY_ARGS, *BASE]
    trainers = {
        dtype: _run(
            [*args, "--embedding_dtype", dtype, "--output_dir", str(tmp / dtype)], evaluate_first=dtype == "bfloat16"
        )
        for dtype in ("bfloat16", "float32")
    }
    return tmp, args, trainers


def test_bf16_embedding_trains_like_float32_and_saves_what_nanochat_saves(runs):
    tmp, _, trainers = runs
    bf16, fp32 = tmp / "bfloat16" / "checkpoint-2", tmp / "float32" / "checkpoint-2"
    assert trainers["bfloat16"].model.get_input_embeddings().weight.dtype == torch.bfloat16
    for folder in (bf16.with_name("checkpoint-1"), bf16):  # the embedding stays bf16 all along
        dtypes = _dtypes(folder / "model.safetensors")
        assert dtypes.pop("transformer.wte.weight") == "BF16"
        assert set(dtypes.values()) == {"F32"}
    assert set(_dtypes(fp32 / "model.safetensors").values()) == {"F32"}
    # AdamW keeps float32 moments for the bf16 embedding
    assert set(_dtypes(bf16 / "optimizer.rank0.safetensors").values()) == {"F32"}
    a, b = _losses(bf16), _losses(fp32)
    print("losses, bf16 embedding:", a, "float32 embedding:", b)
    assert [s for s, _ in a] == [1, 2] and all(math.isfinite(x) for _, x in a)
    assert a != b  # the embedding's rounding shows ...
    assert [x for _, x in a] == pytest.approx([x for _, x in b], rel=0.01)  # ... and changes little
    # config.json says float32 (the dtype of the other weights): a reload is float32, the embedding exactly
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "float32"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bf16)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    stored = load_file(str(bf16 / "model.safetensors"))["transformer.wte.weight"]
    assert torch.equal(model.get_input_embeddings().weight, stored.float())
    # converted back to nanochat: wte bfloat16, the rest float32, as nanochat's checkpoints from CUDA
    from nanochat_hf.conversion import to_nanochat

    checkpoint_dir = tmp / "nanochat" / "mid_checkpoints" / "d2"  # nanochat's layout: the tokenizer goes beside
    to_nanochat(bf16, checkpoint_dir)
    state = torch.load(next(checkpoint_dir.glob("model_*.pt")), weights_only=True)
    assert state.pop("transformer.wte.weight").dtype == torch.bfloat16
    assert {t.dtype for t in state.values()} == {torch.float32}


def test_bf16_embedding_resumes_exactly(runs):
    tmp, args, _ = runs
    out, resumed = tmp / "bfloat16", tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-1", resumed / "checkpoint-1")
    _run([*args, "--embedding_dtype", "bfloat16", "--output_dir", str(resumed), "--resume_from_checkpoint", "true"])
    assert _losses(resumed / "checkpoint-2") == _losses(out / "checkpoint-2")
    a = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_embedding_dtype_argument():
    args = parse_args(["--dtype", "float32"])
    assert args.embedding_dtype == "auto" and args.embedding_torch_dtype is None  # off CUDA: as loaded
    assert parse_args(["--dtype", "bfloat16", "--embedding_dtype", "bfloat16"]).embedding_torch_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="embedding_dtype=bfloat16 needs bf16 autocast"):
        parse_args(["--dtype", "float32", "--embedding_dtype", "bfloat16"])
    with pytest.raises(ValueError, match="embedding_dtype='float16': expected one of auto, bfloat16, float32"):
        parse_args(["--embedding_dtype", "float16"])


def test_pinned_copies_only_for_cuda():
    t = torch.arange(6).view(2, 3)
    assert not pins_for(t, "cpu") and not pins_for(t, torch.device("cpu"))
    assert pins_for(t, "cuda") and pins_for(t, torch.device("cuda", 1))
    assert not pins_for(t.to("meta"), "cuda")  # already off the host: nothing to pin
    assert to_device(t, "cpu") is t  # the CPU path is the plain .to(): no copy at all


def test_trainer_places_batches_unchanged_on_cpu(monkeypatch, tmp_path):
    from transformers import Trainer

    from nanochat_hf.training.run import build_trainer, setup

    from .conftest import TINY_ARGS

    def no_pinning(self, *a, **k):
        raise AssertionError("pin_memory called on CPU")

    monkeypatch.setattr(torch.Tensor, "pin_memory", no_pinning)
    trainer = build_trainer(*setup([*TINY_ARGS, "--dry_run", "true", "--output_dir", str(tmp_path)]))
    raw = next(trainer.make_stream(trainer.train_dataset).read())  # a fresh stream: the same first micro-batch
    batch = next(iter(trainer.get_train_dataloader()))  # the loader places the tensors (to_device)
    assert batch.keys() == raw.keys() and all(torch.equal(batch[k], raw[k]) for k in raw)
    stock = Trainer._prepare_inputs(trainer, batch)  # then the Trainer's placement finds them in place
    assert all(stock[k] is batch[k] for k in batch)  # on CPU: the tensors themselves


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_non_blocking_copy_on_cuda():
    t = torch.randint(0, 1000, (4, 65))
    out = to_device(t, "cuda")
    assert out.is_cuda and torch.equal(out.cpu(), t)
