"""Damaged checkpoints are found before resuming, the newest intact one is used, and run fingerprints are compared.

The checkpoint folders are written with the same functions `MidTrainer._save_checkpoint` uses (save_pretrained,
save_optimizer_state, save_rng_state, write_json, TrainerState.save_to_json).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerState

from nanochat_hf.errors import UserError
from nanochat_hf.integration.optimizer_state import save_optimizer_state
from nanochat_hf.jsonfile import write_json
from nanochat_hf.model.configuration_nanochat_gpt import NanoChatGPTConfig
from nanochat_hf.model.modeling_nanochat_gpt import NanoChatGPTForCausalLM
from nanochat_hf.optim import build_optimizer
from nanochat_hf.training.checkpoint.check import (
    FINGERPRINT_FIELDS,
    check_fingerprint,
    code_version,
    data_format,
    load_fingerprint,
    model_config_fields,
    read_run_state,
    resolve_resume_checkpoint,
    run_fingerprint,
    save_fingerprint,
    verify_checkpoint,
)
from nanochat_hf.training.checkpoint.files import save_rng_state


def write_checkpoint(run_dir: Path, step: int, world_size: int = 2) -> Path:
    ckpt = run_dir / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    torch.manual_seed(step)
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(sequence_len=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16))
    model.save_pretrained(ckpt)
    optimizer = build_optimizer(model, sharded=False)
    model(torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long)).loss.backward()
    optimizer.step()
    for rank in range(world_size):
        save_optimizer_state(optimizer, model, ckpt / f"optimizer.rank{rank}.safetensors")
        write_json(ckpt / f"data_state.rank{rank}.json", {"position": step * 10 + rank})
        save_rng_state(ckpt, rank)
    write_json(ckpt / "scheduler.json", {"last_epoch": step})
    write_json(ckpt / "nanochat_state.json", {"logger": {}, "min_val_bpb": 1.5, "world_size": world_size})
    save_fingerprint(ckpt, fingerprint(make_args(run_dir), "abc", "def", world_size))
    TrainerState(global_step=step).save_to_json(str(ckpt / "trainer_state.json"))
    return ckpt


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def run_template(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("template")
    for step in (10, 20):
        write_checkpoint(run_dir, step)
    return run_dir


@pytest.fixture
def run_dir(run_template, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(run_template, tmp_path / "run"))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)


# (what is broken in the newest checkpoint, the file the one-line error must name)
DAMAGE = {
    "missing optimizer shard": (lambda c: (c / "optimizer.rank1.safetensors").unlink(), "optimizer.rank1.safetensors"),
    "truncated optimizer shard": (lambda c: truncate(c / "optimizer.rank0.safetensors"), "optimizer.rank0.safetensors"),
    "truncated model": (lambda c: truncate(c / "model.safetensors"), "model.safetensors"),
    "safetensors header garbage": (
        lambda c: (c / "rng_state.rank1.safetensors").write_bytes(b"\x10" * 64),
        "rng_state.rank1.safetensors",
    ),
    "empty model file": (lambda c: (c / "model.safetensors").write_bytes(b""), "model.safetensors"),
    "bad scheduler JSON": (lambda c: (c / "scheduler.json").write_text('{"last_epoch": 2'), "scheduler.json"),
    "bad data state JSON": (lambda c: (c / "data_state.rank0.json").write_text(""), "data_state.rank0.json"),
    "bad config.json": (lambda c: (c / "config.json").write_text("{not json"), "config.json"),
    "missing trainer_state": (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json"),
    "missing rng json": (lambda c: (c / "rng_state.rank1.json").unlink(), "rng_state.rank1.json"),
    "state without world_size": (
        lambda c: write_json(c / "nanochat_state.json", {"logger": {}}),
        "nanochat_state.json: no 'world_size' field",
    ),
    "missing fingerprint": (lambda c: (c / "run_fingerprint.json").unlink(), "run_fingerprint.json"),
    "fingerprint without a field": (
        lambda c: write_json(c / "run_fingerprint.json", {"seed": 42}),
        "run_fingerprint.json: no 'max_seq_len' field",
    ),
}


def test_intact_checkpoint_passes(run_dir):
    verify_checkpoint(run_dir / "checkpoint-20")
    assert resolve_resume_checkpoint(run_dir, "latest") == (run_dir / "checkpoint-20", [])
    assert resolve_resume_checkpoint(run_dir, None) == (None, [])


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_newest_falls_back_and_explicit_path_fails_in_one_line(run_dir, damage):
    breaker, bad_file = DAMAGE[damage]
    breaker(run_dir / "checkpoint-20")
    before = snapshot(run_dir)

    with pytest.raises(UserError) as err:
        resolve_resume_checkpoint(run_dir, str(run_dir / "checkpoint-20"))
    message = str(err.value)
    assert "\n" not in message and f"checkpoint-20/{bad_file}" in message

    for flag in (True, "true", "last", "latest"):
        path, messages = resolve_resume_checkpoint(run_dir, flag)
        assert path == run_dir / "checkpoint-10"
        assert len(messages) == 1 and messages[0].startswith("skipping checkpoint-20:") and bad_file in messages[0]
    assert snapshot(run_dir) == before  # nothing repaired or deleted behind the user's back


def test_newest_by_step_number(run_dir):
    write_checkpoint(run_dir, 100)  # "checkpoint-100" sorts before "checkpoint-20" as text
    (run_dir / "checkpoint-notastep").mkdir()
    path, messages = resolve_resume_checkpoint(run_dir, "latest")
    assert path == run_dir / "checkpoint-100"
    assert messages == []


def test_no_intact_checkpoint_is_one_line(run_dir, tmp_path):
    truncate(run_dir / "checkpoint-20" / "model.safetensors")
    (run_dir / "checkpoint-10" / "scheduler.json").unlink()
    with pytest.raises(UserError, match=r"no intact checkpoint-<step> folder") as err:
        resolve_resume_checkpoint(run_dir, "latest")
    assert "\n" not in str(err.value) and "checkpoint-10" in str(err.value) and "checkpoint-20" in str(err.value)
    with pytest.raises(UserError, match="no intact"):
        resolve_resume_checkpoint(tmp_path / "empty", True)
    with pytest.raises(UserError, match="checkpoint folder not found"):
        resolve_resume_checkpoint(run_dir, str(tmp_path / "nope"))


def test_another_world_size_resumes_and_every_file_it_names_is_required(run_dir):
    """Any number of processes may resume a checkpoint (the newest intact one is picked whatever wrote it); the
    files required are those of the processes and data shards nanochat_state.json names."""
    ckpt = run_dir / "checkpoint-20"
    assert resolve_resume_checkpoint(run_dir, "latest") == (ckpt, [])
    assert read_run_state(ckpt)["data_shards"] == 2  # absent: the world size
    write_json(ckpt / "nanochat_state.json", {"logger": {}, "min_val_bpb": 1.5, "world_size": 2, "data_shards": 3})
    with pytest.raises(UserError, match=r"checkpoint-20/data_state.rank2.json: missing"):
        verify_checkpoint(ckpt)
    write_json(ckpt / "nanochat_state.json", {"logger": {}, "min_val_bpb": 1.5, "world_size": 3, "data_shards": 2})
    with pytest.raises(UserError, match=r"checkpoint-20/optimizer.rank2.safetensors: missing"):
        verify_checkpoint(ckpt)


def test_sharded_model_index_lists_required_shards(run_dir):
    ckpt = run_dir / "checkpoint-20"
    weights = ckpt / "model.safetensors"
    weights.rename(ckpt / "model-00001-of-00002.safetensors")
    write_json(
        ckpt / "model.safetensors.index.json",
        {
            "metadata": {},
            "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
        },
    )
    with pytest.raises(UserError, match=r"model-00002-of-00002.safetensors: missing"):
        verify_checkpoint(ckpt)


# ---- fingerprint --------------------------------------------------------------------------------------------------


def fingerprint(args: SimpleNamespace, train: str, val: str, world_size: int) -> dict:
    """A run fingerprint of a small model and a fixed data format."""
    return run_fingerprint(args, train, val, world_size, {"n_layer": 2, "n_embd": 64}, "sha256:aaa")


def make_args(tmp_path: Path, **overrides) -> SimpleNamespace:
    mixture = tmp_path / "mix.yaml"
    if not mixture.exists():
        mixture.write_text("train:\n  - smoltalk\n")
    values = dict(
        seed=42,
        max_seq_len=64,
        device_batch_size=2,
        total_batch_size=256,
        num_iterations=-1,
        matrix_lr=0.02,
        embedding_lr=0.2,
        unembedding_lr=0.004,
        init_lr_frac=1.0,
        weight_decay=0.0,
        max_grad_norm=0.0,
        train_mixture=str(mixture),
        val_mixture=None,
        packing="stream",
        completion_only_loss=False,
        warmdown_ratio=0.2,
        optimizer_recipe="2025-12",
    )
    return SimpleNamespace(**{**values, **overrides})


def test_fingerprint_roundtrip_and_unchanged_run(tmp_path):
    fp = fingerprint(make_args(tmp_path), "abc123", "def456", world_size=2)
    assert fp["train_mixture"].startswith("sha256:") and fp["world_size"] == 2 and fp["train_dataset"] == "abc123"
    assert tuple(fp) == FINGERPRINT_FIELDS  # the fields a saved fingerprint must hold are the ones written
    save_fingerprint(tmp_path, fp)
    assert load_fingerprint(tmp_path) == fp
    assert check_fingerprint(load_fingerprint(tmp_path), fp, resume_step=20) == []


@pytest.mark.parametrize(
    "field,new",
    [
        ("seed", 43),
        ("max_seq_len", 128),
        ("device_batch_size", 4),
        ("total_batch_size", 512),
        ("num_iterations", 100),
        ("weight_decay", 0.1),
        ("max_grad_norm", 1.0),
        ("packing", "bestfit"),
        ("completion_only_loss", True),
        ("warmdown_ratio", 0.5),
        ("optimizer_recipe", "2026-07"),
    ],
)
def test_changed_data_or_optimizer_field_is_refused_naming_it(tmp_path, field, new):
    saved = fingerprint(make_args(tmp_path), "abc", "def", 1)
    current = fingerprint(make_args(tmp_path, **{field: new}), "abc", "def", 1)
    with pytest.raises(UserError) as err:
        check_fingerprint(saved, current, resume_step=20)
    assert "\n" not in str(err.value) and f"cannot resume: {field} was {saved[field]!r}" in str(err.value)
    assert f"is {new!r} now" in str(err.value)


def test_changed_mixture_content_or_dataset_is_refused_another_world_size_said(tmp_path):
    saved = fingerprint(make_args(tmp_path), "abc", "def", 1)
    (tmp_path / "mix.yaml").write_text("train:\n  - gsm8k\n")  # same path, other content
    with pytest.raises(UserError, match=r"cannot resume: train_mixture was 'sha256:"):
        check_fingerprint(saved, fingerprint(make_args(tmp_path), "abc", "def", 1), 20)
    (tmp_path / "mix.yaml").write_text("train:\n  - smoltalk\n")
    with pytest.raises(UserError, match=r"cannot resume: train_dataset was 'abc' in the checkpoint and is 'xyz'"):
        check_fingerprint(saved, fingerprint(make_args(tmp_path), "xyz", "def", 1), 20)
    notices = check_fingerprint(saved, fingerprint(make_args(tmp_path), "abc", "def", 2), 20)  # a notice
    assert any("resuming a run of 1 processes on 2: the optimizer state is re-sharded" in n for n in notices)


def test_changed_lr_is_a_notice_to_apply(tmp_path):
    saved = fingerprint(make_args(tmp_path), "abc", "def", 1)
    current = fingerprint(make_args(tmp_path, matrix_lr=0.01, init_lr_frac=0.5), "abc", "def", 1)
    assert check_fingerprint(saved, current, resume_step=20) == [
        "matrix_lr changed 0.02 -> 0.01: applied from step 20",
        "init_lr_frac changed 1.0 -> 0.5: applied from step 20",
    ]


def test_fingerprint_lacking_a_field_or_not_json_is_one_line_naming_it(tmp_path):
    fp = run_fingerprint(make_args(tmp_path), "abc", "def", 1, {"n_layer": 2}, "sha256:aaa")
    save_fingerprint(tmp_path, {k: v for k, v in fp.items() if k != "model_config"})
    with pytest.raises(UserError) as err:
        load_fingerprint(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'run_fingerprint.json'}: no 'model_config' field (the file is damaged or was not written by "
        "nanochat-hf)"
    )
    (tmp_path / "run_fingerprint.json").write_text("{")
    with pytest.raises(UserError, match=r"run_fingerprint.json: not valid JSON"):
        load_fingerprint(tmp_path)


def _full(tmp_path, config: NanoChatGPTConfig, fmt: str = "sha256:aaa", **args) -> dict:
    return run_fingerprint(make_args(tmp_path, **args), "abc", "def", 1, model_config_fields(config), fmt)


def test_model_config_data_format_and_code_version_on_resume(tmp_path):
    config = NanoChatGPTConfig(n_layer=2, n_head=4, n_kv_head=4, n_embd=64)
    saved = _full(tmp_path, config)
    assert saved["model_config"]["n_head"] == 4 and saved["code_version"] == code_version()
    assert (
        check_fingerprint(saved, _full(tmp_path, NanoChatGPTConfig(n_layer=2, n_head=4, n_kv_head=4, n_embd=64)), 5)
        == []
    )
    for changed, named in (
        ({"n_head": 2, "n_kv_head": 2}, "n_head was 4 in the checkpoint and is 2 now"),
        ({"n_layer": 3}, "n_layer was 2 in the checkpoint and is 3 now"),
    ):
        other = NanoChatGPTConfig(**{"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 64, **changed})
        with pytest.raises(UserError) as err:
            check_fingerprint(saved, _full(tmp_path, other), 5)
        assert str(err.value).startswith(f"cannot resume: the model config differs: {named}")
    with pytest.raises(
        UserError,
        match=r"^cannot resume: data_format was 'sha256:aaa' in the checkpoint and is "
        r"'sha256:bbb' now; the chat rendering or tokenizer changed the token ids",
    ):
        check_fingerprint(saved, _full(tmp_path, config, "sha256:bbb"), 5)
    # another code version with everything else equal: continued, and said
    assert check_fingerprint({**saved, "code_version": "nanochat-hf 0.0.9"}, saved, 5) == [
        f"the checkpoint was written by nanochat-hf 0.0.9, this is {code_version()}: model config, data format and "
        "run setup match, continuing"
    ]


def test_data_format_follows_the_rendering(monkeypatch):
    from nanochat_hf.tokenizer import chat, train_tokenizer

    tokenizer = train_tokenizer(["Hello there, how many r in strawberry? 2+2=4"] * 20, vocab_size=300)
    fmt = data_format(tokenizer)
    assert fmt.startswith("sha256:") and data_format(tokenizer) == fmt
    original = chat._plan

    def plan_with_a_trailing_space(messages, ids, texts):
        plan = original(messages, ids, texts)
        texts[-1] += " "
        return plan

    monkeypatch.setattr(chat, "_plan", plan_with_a_trailing_space)
    assert data_format(tokenizer) != fmt  # a renderer that changes one text is another data format


def test_changed_data_behind_the_same_mixture_is_refused_via_dataset_fingerprint(tmp_path):
    from datasets import Dataset

    rows = [{"conversation": '[{"role": "user", "content": "hi"}]', "task": "t"}] * 3
    same = Dataset.from_list(rows)._fingerprint
    assert Dataset.from_list(rows)._fingerprint == same  # deterministic for the same data
    saved = fingerprint(make_args(tmp_path), same, same, 1)
    changed = Dataset.from_list(rows[:2])._fingerprint
    with pytest.raises(UserError, match=r"cannot resume: train_dataset was"):
        check_fingerprint(saved, fingerprint(make_args(tmp_path), changed, same, 1), 20)
