"""nanochat HEAD's SFT recipe: the configs, inheritance from the base meta, the schedule, completion-only rows."""

import json
from pathlib import Path

import numpy as np
import pytest

from nanochat_hf.data import BestFitStream, demo_tokenizer, load_mixture, read_mixture, tokenize_conversations
from nanochat_hf.training.arguments import parse_args
from nanochat_hf.training.schedule import lr_multiplier

REPO = Path(__file__).resolve().parents[2]
SFT = str(REPO / "configs" / "sft_nanochat.yaml")
META = {
    "step": 10,
    "model_config": {},
    "max_seq_len": 64,
    "device_batch_size": 4,
    "total_batch_size": 512,
    "user_config": {"embedding_lr": 0.3, "unembedding_lr": 0.008, "matrix_lr": 0.025, "total_batch_size": -1},
}


def nanochat_base(tmp_path: Path, meta: dict) -> Path:
    """A nanochat base dir as far as argument parsing reads it: base_checkpoints/d2/{model,meta}_000010."""
    tag = tmp_path / "base" / "base_checkpoints" / "d2"
    tag.mkdir(parents=True)
    (tag / "model_000010.pt").write_bytes(b"")
    (tag / "meta_000010.json").write_text(json.dumps(meta))
    return tmp_path / "base"


def test_inherits_what_is_not_given_and_says_which(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = nanochat_base(tmp_path, META)
    args = parse_args(
        [
            SFT,
            "--model_source",
            str(base),
            "--matrix_lr",
            "0.03",
            "--per_device_train_batch_size",
            "2",
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    assert (args.max_seq_len, args.total_batch_size, args.embedding_lr, args.unembedding_lr) == (64, 512, 0.3, 0.008)
    assert (args.matrix_lr, args.device_batch_size, args.gradient_accumulation_steps) == (0.03, 2, 4)
    meta = base / "base_checkpoints" / "d2" / "meta_000010.json"
    assert capsys.readouterr().out.splitlines() == [
        f"mid_train: inherited max_seq_len=64 from {meta}",
        "mid_train: device_batch_size=2 overrides the base checkpoint's 4",
        f"mid_train: inherited total_batch_size=512 from {meta}",
        f"mid_train: inherited embedding_lr=0.3 from {meta}",
        f"mid_train: inherited unembedding_lr=0.008 from {meta}",
        "mid_train: matrix_lr=0.03 overrides the base checkpoint's 0.025",
        # chat_sft.py's default --load-optimizer 1, said in the run's first lines (this base has no such file)
        f"mid_train: no optimizer file {meta.parent / 'optim_000010_rank0.pt'}: the optimizer starts fresh "
        "(chat_sft.py: slightly worse)",
    ]
    # the recipe's own settings
    assert (args.packing, args.completion_only_loss, args.init_lr_frac, args.warmdown_ratio) == (
        "bestfit",
        True,
        0.8,
        0.5,
    )
    assert (args.eval_every, args.chatcore_every, args.eval_tokens, args.num_iterations) == (200, 200, 40 * 524288, -1)


def test_the_base_runs_optimizer_files_warm_start_by_default(tmp_path, capsys, monkeypatch):
    """chat_sft.py --load-optimizer 1: the optimizer files beside the base checkpoint are used unless
    --load_optimizer false; the December recipe (its mid_train.py never loads them) only when asked."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = nanochat_base(tmp_path, META)
    optim = base / "base_checkpoints" / "d2" / "optim_000010_rank0.pt"
    optim.write_bytes(b"")  # read and checked by the trainer, before training
    args = parse_args([SFT, "--model_source", str(base)])
    assert args.nanochat_optimizer == str(optim)
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"mid_train: warm-starting the optimizer from {optim} as chat_sft.py does (--load_optimizer false: a fresh one)"
    )
    assert parse_args([SFT, "--model_source", str(base), "--load_optimizer", "false"]).nanochat_optimizer is None
    december = ["--model_source", str(base), "--optimizer_recipe", "2025-12"]
    assert parse_args(december).nanochat_optimizer is None
    assert parse_args([*december, "--load_optimizer", "true"]).nanochat_optimizer == str(optim)
    with pytest.raises(ValueError, match=r"^load_optimizer=false and nanochat_optimizer=x.pt conflict: give one$"):
        parse_args([SFT, "--model_source", str(base), "--load_optimizer", "false", "--nanochat_optimizer", "x.pt"])
    with pytest.raises(ValueError, match=r"^load_optimizer=true: model_source='demo' is not a nanochat checkpoint"):
        parse_args(["--load_optimizer", "true"])


def test_december_meta_and_converted_model(tmp_path, monkeypatch):
    """The December base_train kept total_batch_size in user_config only; a converted model keeps the meta as
    nanochat_meta.json."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    meta = {k: v for k, v in META.items() if k != "total_batch_size"}
    meta["user_config"] = {**META["user_config"], "total_batch_size": 1024}
    args = parse_args([SFT, "--model_source", str(nanochat_base(tmp_path, meta))])
    assert args.total_batch_size == 1024
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "nanochat_meta.json").write_text(json.dumps(META))
    assert parse_args([SFT, "--model_source", str(hf)]).max_seq_len == 64


@pytest.mark.parametrize(
    "drop,expected",
    [
        (("max_seq_len", "matrix_lr"), "meta_000010.json: no max_seq_len, matrix_lr to inherit"),
        (("user_config",), "meta_000010.json: no embedding_lr, unembedding_lr, matrix_lr to inherit"),
    ],
)
def test_meta_without_the_fields_is_one_line(tmp_path, drop, expected):
    meta = {k: v for k, v in META.items() if k not in drop}
    if "matrix_lr" in drop:
        meta["user_config"] = {k: v for k, v in META["user_config"].items() if k != "matrix_lr"}
    with pytest.raises(ValueError) as err:
        parse_args([SFT, "--model_source", str(nanochat_base(tmp_path, meta))])
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert "give them in the config or as flags" in str(err.value)
    assert not (tmp_path / "outputs").exists()


def test_nothing_to_inherit_from_is_one_line_and_all_given_needs_no_meta(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(
        ValueError,
        match=r"^inherit_from_base: model_source='demo' has no nanochat meta .* to inherit "
        r"max_seq_len, device_batch_size, total_batch_size, embedding_lr, "
        r"unembedding_lr, matrix_lr from; give them",
    ):
        parse_args([SFT, "--model_source", "demo"])
    given = [
        "--max_seq_len",
        "64",
        "--device_batch_size",
        "2",
        "--total_batch_size",
        "256",
        "--embedding_lr",
        "0.2",
        "--unembedding_lr",
        "0.004",
        "--matrix_lr",
        "0.02",
    ]
    assert parse_args([SFT, "--model_source", "demo", *given]).max_seq_len == 64


def test_demo_config_and_mixture_parse():
    args = parse_args([str(REPO / "configs" / "sft_demo.yaml")])
    assert (args.packing, args.completion_only_loss, args.warmdown_ratio, args.init_lr_frac) == (
        "bestfit",
        True,
        0.5,
        0.8,
    )
    assert not args.inherit_from_base and args.model_source == "demo"
    path = REPO / "configs" / "mixtures" / "sft_nanochat.yaml"
    seed, train, _ = read_mixture(path, "train")
    assert seed == 42 and [(t.task, t.config, t.repeat) for t in train] == [
        ("smoltalk", None, 1),
        ("mmlu", "auxiliary_train", 3),
        ("gsm8k", "main", 4),
    ]
    _, val, _ = read_mixture(path, "val")
    assert [(t.task, t.split, t.stop) for t in val] == [
        ("smoltalk", "test", None),
        ("mmlu", "test", 5200),
        ("gsm8k", "test", 420),
    ]


def test_bad_recipe_values_are_one_line():
    for flags, expected in (
        (["--packing", "greedy"], "packing='greedy': expected stream or bestfit"),
        (["--warmdown_ratio", "0"], "warmdown_ratio=0.0: expected a fraction in (0, 1]"),
        (["--chatcore_every", "75"], "chatcore_every=75 must be a multiple of eval_every=50"),
    ):
        with pytest.raises(ValueError) as err:
            parse_args([str(REPO / "configs" / "sft_demo.yaml"), *flags])
        assert str(err.value).startswith(expected)


def test_december_schedule_is_bit_identical():
    """lr_multiplier is nanochat HEAD's formula; at warmdown 0.2 it is the December mid-training one, bit for bit."""

    def december(p):  # nanochat's mid_train.py at 790f3be
        return 1.0 if p < 0.8 else 1.0 - (p - 0.8) / 0.2

    grid = np.concatenate([np.linspace(0, 1.05, 100_001), np.nextafter(0.8, [0, 1]), [0.8]])
    assert all(lr_multiplier(float(p)) == december(float(p)) for p in grid)


def test_completion_only_rows(monkeypatch):
    """The tokenized SFT rows: targets only on the assistant's tokens, each row starting with BOS."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = demo_tokenizer()
    ds = tokenize_conversations(load_mixture(None, "val").select(range(40)), tok, assistant_only=True)
    batch = next(BestFitStream(ds, 64, 4, bos_token_id=tok.bos_token_id).read(1))
    ids, labels = batch["input_ids"], batch["labels"]
    assert (ids[:, 0] == tok.bos_token_id).all()
    start, end = (tok.convert_tokens_to_ids(t) for t in ("<|assistant_start|>", "<|assistant_end|>"))
    assert (labels[ids == start] == -100).all() and (labels[ids == end] == end).all()
    user = tok.convert_tokens_to_ids("<|user_start|>")
    assert (labels[ids == user] == -100).all() and (labels != -100).any()


@pytest.mark.slow
def test_chatcore_every_n_steps_and_at_the_end(tmp_path, monkeypatch, capsys):
    """ChatCORE at the evaluations of every chatcore_every-th step and the last (not step 0); a task whose data
    cannot be loaded (a hub task offline) is skipped in one line."""
    import datasets
    import huggingface_hub

    from nanochat_hf.training import trainer as trainer_module
    from nanochat_hf.training.run import main

    # offline as a run started with HF_HUB_OFFLINE=1 (both libraries read it at import): without this, the hub task
    # failed only after huggingface_hub's retries against an unreachable network, about 24 s per evaluation
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(trainer_module, "CHATCORE_TASKS", ("SpellingBee", "ARC-Easy"))
    out, mixture = tmp_path / "out", tmp_path / "mix.yaml"
    mixture.write_text(
        json.dumps(
            {
                "train": {"tasks": [{"task": "simple_spelling", "size": 60, "words": "demo"}]},
                "val": {"tasks": [{"task": "simple_spelling", "size": 10, "words": "demo"}]},
            }
        )
    )
    main(
        [
            str(REPO / "configs" / "sft_demo.yaml"),
            "--train_mixture",
            str(mixture),
            "--val_mixture",
            str(mixture),
            "--demo_depth",
            "1",
            "--max_seq_len",
            "64",
            "--device_batch_size",
            "2",
            "--total_batch_size",
            "128",
            "--num_iterations",
            "3",
            "--eval_every",
            "2",
            "--eval_tokens",
            "128",
            "--chatcore_every",
            "2",
            "--chatcore_max_sample",
            "1",
            "--spelling_eval_rows",
            "0",
            "--chat_eval_tasks",
            "",
            "--torch_compile",
            "false",
            "--disable_tqdm",
            "true",
            "--output_dir",
            str(out),
        ]
    )
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "eval_chatcore" in h] == [2, 3]
    assert [h["step"] for h in history if "eval_val_bpb" in h] == [0, 2, 3]
    assert all(
        "eval_chatcore/SpellingBee" in h and "eval_chatcore/ARC-Easy" not in h for h in history if "eval_chatcore" in h
    )
    skipped = [line for line in capsys.readouterr().out.splitlines() if "ChatCORE: ARC-Easy skipped" in line]
    assert len(skipped) == 2
