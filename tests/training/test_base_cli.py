"""base_train's command line (`nanochat_hf.training.base_cli`): the stored description of its arguments matches
BaseTrainingArguments' parser, the quick answers (--help, --version, argument errors) are the real parse's word for
word, and mid_train's own fields, which base_train does not read, are refused in one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanochat_hf.errors import UserError
from nanochat_hf.training import base_cli, cli, run
from nanochat_hf.training.base_arguments import _parser, parse_base_args

from .conftest import answer

ROOT = Path(__file__).resolve().parents[2]


def test_the_arguments_file_describes_the_parser():
    stored = json.loads(base_cli.ARGUMENTS_FILE.read_text())
    assert cli.describe(_parser()) == stored, (
        f"{base_cli.ARGUMENTS_FILE.name} is out of date: run `python -m nanochat_hf.training.base_arguments`"
    )


def real_parse(argv: list[str]) -> None:
    """What base_train does with its command line (base_run.main): parse it, or say what is wrong."""
    mid_train, run.PROG = run.PROG, base_cli.PROG
    try:
        parse_base_args(argv)
    except (UserError, OSError) as e:
        run._fail(e)
    finally:
        run.PROG = mid_train


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["configs/base_demo.yaml", "-h"],  # a config file's values are the defaults shown
        ["--version"],
        ["--depth", "x"],
        ["--nope", "3"],
        ["--fp8", "maybe"],
        ["configs/nope.yaml"],
        ["configs/base_d24.yaml", "--nope"],
    ],
)
def test_quick_answers_are_the_real_parse(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    quick = answer(base_cli.answer_quickly, argv, capsys)
    assert quick[0] is not None  # answered, without the real parse
    assert quick == answer(real_parse, argv, capsys)


def test_help_shows_heads_knobs_and_hides_mid_train_fields(capsys):
    code, out, _ = answer(base_cli.answer_quickly, ["--help"], capsys)
    assert code == 0
    assert "--warmup_steps WARMUP_STEPS" in out and "--fp8_recipe FP8_RECIPE" in out  # HEAD's knobs
    for name in ("model_source", "train_mixture", "chatcore_every", "chat_eval_tasks", "init_lr_frac"):
        assert f"--{name}" not in out


@pytest.mark.parametrize(
    "flag, hint",
    [
        ("--model_source=org/model", "base_train trains a fresh model sized by depth, aspect_ratio and head_dim"),
        ("--train_mixture=configs/mixtures/sft.yaml", "base_train reads pretraining shards (data_dir)"),
        ("--chatcore_every=100", "base_train evaluates CORE (core_metric_every, core_metric_max_per_task)"),
        ("--chat_eval_tasks=GSM8K", "base_train samples HEAD's prompts (sample_every)"),
        ("--init_lr_frac=0.5", "HEAD's schedule: warmup_steps, warmdown_ratio, final_lr_frac"),
    ],
)
def test_mid_train_fields_are_refused_in_one_line(flag, hint):
    name, value = flag[2:].split("=")
    with pytest.raises(UserError) as e:
        parse_base_args([flag, "--use_cpu=true", "--output_dir=/nonexistent"])
    assert str(e.value).startswith(f"{name}={value} is not used by this recipe: {hint}")


@pytest.mark.parametrize("config", ["configs/base_demo.yaml", "configs/base_d24.yaml"])
def test_the_configs_parse(config, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = parse_base_args([config, "--use_cpu=true"])
    assert args.warmup_steps == (5 if "demo" in config else 40)


@pytest.mark.parametrize("quick", [base_cli.answer_quickly, cli.answer_quickly], ids=["base_train", "mid_train"])
def test_a_flag_naming_a_yaml_file_is_a_flag_not_a_config_file(quick, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, _, err = answer(quick, ["--tokenizer_dir=configs/mixtures/demo.yaml", "--nope"], capsys)
    assert code == 2 and err.strip().endswith("error: unrecognized arguments: --nope (see --help)")
