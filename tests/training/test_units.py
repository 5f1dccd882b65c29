"""Arguments, schedules, bits per byte and exact match."""

import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch
import yaml

from nanochat_hf.evaluation import ExactMatch
from nanochat_hf.integration.momentum import muon_momentum
from nanochat_hf.training.arguments import DEMO_CONFIG, MidTrainingArguments, parse_args
from nanochat_hf.training.evaluation import evaluate_bpb
from nanochat_hf.training.schedule import lr_multiplier, nanochat_scheduler, steps_progress


def test_yaml_then_cli_override(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model_source: demo\ndevice_batch_size: 4\nmax_seq_len: 128\ntotal_batch_size: 2048\n"
        "matrix_lr: 0.01\neval_every: 7\nnum_iterations: 12\n"
    )
    args = parse_args([str(cfg), "--device_batch_size", "2"])
    assert (args.device_batch_size, args.max_seq_len, args.matrix_lr) == (2, 128, 0.01)
    assert args.gradient_accumulation_steps == 2048 // (2 * 128)
    assert args.per_device_train_batch_size == 2 and args.max_steps == 12 and args.eval_steps == 7
    assert not args.bf16 and args.save_strategy == "no" and args.max_grad_norm == 0.0


def test_nanochat_defaults_with_a_model_source():
    args = parse_args(["--model_source", "some/repo"])
    assert (args.device_batch_size, args.max_seq_len, args.total_batch_size) == (32, 2048, 524288)
    assert (args.matrix_lr, args.embedding_lr, args.unembedding_lr, args.init_lr_frac) == (0.02, 0.2, 0.004, 1.0)
    assert (args.eval_every, args.eval_tokens, args.num_iterations, args.weight_decay) == (150, 20 * 524288, -1, 0.0)
    assert args.gradient_accumulation_steps == 8


def test_dtype_request_and_dry_run():
    args = parse_args(["--dtype", "bfloat16", "--dry_run", "true", "--save_steps", "5"])
    assert args.bf16 and args.save_strategy == "no"


@pytest.mark.parametrize("n", [1, 3, 5, 7, 10, 37, 150, 1001])
def test_fixed_step_schedule_is_nanochat_multiplier(n):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = nanochat_scheduler(opt, steps_progress(n))
    for step in range(n):
        progress = step / n
        expected = 1.0 if progress < 0.8 else 1.0 - (progress - 0.8) / 0.2
        assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * expected, abs=1e-12), step
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # progress 1.0
    assert lr_multiplier(0.9) == pytest.approx(0.5)


def test_the_issue_example_gives_what_was_asked_or_says_why_not():
    args = parse_args(["--max_steps", "10", "--per_device_train_batch_size", "4", "--bf16", "true"])
    assert (args.max_steps, args.num_iterations) == (10, 10)
    assert (args.per_device_train_batch_size, args.device_batch_size) == (4, 4)
    assert args.bf16 and args.dtype == "bfloat16"
    with pytest.raises(ValueError, match="learning_rate=0.001 is not used by this recipe: use matrix_lr"):
        parse_args(["--max_steps", "10", "--learning_rate", "1e-3"])
    with pytest.raises(ValueError, match="lr_scheduler_type=cosine is not used"):
        parse_args(["--lr_scheduler_type", "cosine"])
    assert parse_args(["--eval_steps", "5"]).eval_every == 5
    assert parse_args(["--model_source", "demo", "--eval_steps", "5"]).eval_steps == 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max_steps", "5", "--num_iterations", "6"], "num_iterations=6 and max_steps=5 conflict"),
        (["--device_batch_size", "4", "--per_device_train_batch_size", "2"], "device_batch_size=4 and per_device"),
        (["--eval_every", "3", "--eval_steps", "4"], "eval_every=3 and eval_steps=4 conflict"),
        (["--bf16", "true", "--dtype", "float32"], "dtype=float32 and bf16=True conflict"),
        (["--gradient_accumulation_steps", "3"], "gradient_accumulation_steps=3 conflicts with total_batch_size"),
        (["--per_device_eval_batch_size", "3"], "validation uses device_batch_size"),
        (["--optim", "adamw_torch"], "optim=adamw_torch is not used"),
        (["--warmup_steps", "10"], "no LR warm-up"),
        (["--adam_beta2", "0.99"], "(0.8, 0.95)"),
        (["--num_train_epochs", "2"], "use num_iterations"),
        (["--dataloader_num_workers", "2"], "main process"),
    ],
)
def test_conflicts_and_unused_fields_are_refused(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_args(argv)


def test_demo_defaults_with_or_without_model_source_demo_and_no_side_effects():
    threads = torch.get_num_threads()
    plain, demo = parse_args([]), parse_args(["--model_source", "demo"])
    for name in (
        "max_seq_len",
        "device_batch_size",
        "total_batch_size",
        "eval_every",
        "eval_tokens",
        "demo_depth",
        "gradient_accumulation_steps",
        "per_device_train_batch_size",
        "eval_steps",
    ):
        assert getattr(plain, name) == getattr(demo, name), name
    assert (demo.device_batch_size, demo.max_seq_len) == (8, 256)
    # the demo runs nanochat's chat eval on SpellingBee (offline); the library default runs none
    assert (demo.chat_eval_task_list, demo.chat_eval_max_problems) == (["SpellingBee"], 32)
    assert parse_args(["--model_source", "some/model"]).chat_eval_task_list == []
    assert parse_args(["--num_threads", "1"]).num_threads == 1 and torch.get_num_threads() == threads
    # a config value of an alias gives way to a flag naming the other name of the pair
    assert parse_args(["--per_device_train_batch_size", "4"]).device_batch_size == 4


def test_demo_settings_live_in_one_file_and_the_argument_defaults_agree_with_it():
    """configs/demo.yaml is the packaged demo.yaml; the default run takes every value from it, and a demo-only
    argument (demo_*), whose dataclass default is that file's value too, does not drift from it."""
    repo_config = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert repo_config.is_symlink() and repo_config.resolve() == DEMO_CONFIG.resolve()
    values = yaml.safe_load(DEMO_CONFIG.read_text())
    args = parse_args([])
    for name, value in values.items():
        assert getattr(args, name) == value, name
    defaults = {f.name: f.default for f in dataclasses.fields(MidTrainingArguments)}
    demo_only = [name for name in defaults if name.startswith("demo_")]
    assert demo_only and all(name in values for name in demo_only)
    for name in demo_only:
        assert defaults[name] == values[name], f"{name}: default {defaults[name]}, demo.yaml {values[name]}"


def _reference_progress(lengths, world, grad_accum, tokens_per_batch, steps):
    """nanochat's rank-0 generator: cursor 0, W, 2W, ... wrapping; progress after each micro-step's prefetch."""
    size, cursor, buf, progress, out, approx = len(lengths), 0, 0, 0.0, [], 0.0

    def draw():
        nonlocal cursor, buf, approx
        while buf < tokens_per_batch:
            buf += lengths[cursor]
            cursor += world
            if cursor >= size:
                cursor -= size
        buf -= tokens_per_batch
        approx = cursor / size

    draw()  # prefetch
    for _ in range(steps):
        for _ in range(grad_accum):
            draw()
            progress = max(progress, approx)
        out.append(progress)
    return out


@pytest.mark.parametrize("world, grad_accum", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_stream_progress_is_nanochats_cursor(world, grad_accum):
    from datasets import Dataset

    from nanochat_hf.data import PackedStream

    rng = random.Random(world * 10 + grad_accum)
    lengths = [rng.randint(3, 40) for _ in range(101)]
    ds = Dataset.from_dict(
        {"input_ids": [[1] * n for n in lengths], "labels": [[1] * n for n in lengths], "num_tokens": lengths}
    )
    stream = PackedStream(ds, max_seq_len=8, device_batch_size=2, rank=world - 1, world_size=world)
    steps = stream.epoch_steps(grad_accum) + 2  # into the next epoch, where the max keeps the pre-wrap value
    expected = _reference_progress(lengths, world, grad_accum, 17, steps)
    assert [stream.lr_progress(s, grad_accum) for s in range(steps)] == pytest.approx(expected, abs=1e-12)


def test_muon_momentum_warmup():
    assert muon_momentum(0) == pytest.approx(0.85)
    assert muon_momentum(150) == pytest.approx(0.90)
    assert muon_momentum(300) == muon_momentum(5000) == pytest.approx(0.95)


class _Fixed(torch.nn.Module):
    """Per-token loss = target id + 1 (nats; non-zero for the special token too), so bpb is computable by hand."""

    def forward(self, input_ids, labels, loss_reduction):
        tgt = labels[:, 1:]
        return type("Out", (), {"loss": torch.where(tgt == -100, 0.0, tgt.float() + 1)})()


def test_bits_per_byte_by_hand():
    token_bytes = torch.tensor([0, 1, 2, 3])  # token 0 is "special": 0 bytes, its loss is not counted
    labels = torch.tensor([[1, 2, 0, 3, -100], [3, 3, 1, 2, 0]])
    bpb = evaluate_bpb(_Fixed(), [{"input_ids": labels.clamp(min=0), "labels": labels}], token_bytes, "cpu")
    # targets: [2,0,3,-] and [3,1,2,0]: nats of byte-bearing targets 3+4+4+2+3 = 16 (the two 0s excluded),
    # bytes 2+3+3+1+2 = 11
    assert bpb == pytest.approx(16 / (math.log(2) * 11))


def test_exact_match_metric():
    m = ExactMatch()
    m.add_batch(predictions=["cat:c,a,t ", "dog"], references=["cat:c,a,t", "dog:d,o,g"])
    assert m.compute()["exact_match"] == 0.5


def test_shipped_configs_compile_and_the_tests_shared_arguments_stay_eager():
    from .conftest import REPO_ROOT, TINY_ARGS

    assert parse_args([]).torch_compile and parse_args([str(REPO_ROOT / "configs" / "mid_d20.yaml")]).torch_compile
    assert not parse_args(["--torch_compile", "false"]).torch_compile  # the way out
    assert not parse_args(TINY_ARGS).torch_compile
