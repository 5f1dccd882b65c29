"""mid_train's instant command line (`nanochat_hf.training.cli`): the stored description of its arguments matches
MidTrainingArguments' parser, and the quick answers (--help, --version, argument errors) are the real parse's,
word for word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanochat_hf.errors import UserError
from nanochat_hf.training import cli
from nanochat_hf.training.arguments import _parser, parse_args
from nanochat_hf.training.run import _fail

from .conftest import answer

ROOT = Path(__file__).resolve().parents[2]


def test_the_arguments_file_describes_the_parser():
    stored = json.loads(cli.ARGUMENTS_FILE.read_text())
    assert cli.describe(_parser()) == stored, (
        f"{cli.ARGUMENTS_FILE.name} is out of date: run `python -m nanochat_hf.training.arguments` to rewrite it"
    )


def real_parse(argv: list[str]) -> None:
    """What mid_train does with its command line: parse it, or say what is wrong (run.main's way)."""
    try:
        parse_args(argv)
    except (UserError, OSError) as e:
        _fail(e)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["configs/sft_demo.yaml", "-h"],  # a config file's values are the defaults shown
        ["--model_source", "org/model", "--help"],  # the dataclass defaults, not the demo config's
        ["--version"],
        ["--max_steps", "x"],
        ["--max-steps=x"],
        ["--nope", "3"],
        ["--bf16", "maybe"],
        ["--optim", "nope"],
        ["--report_to"],
        ["configs/nope.yaml"],
        ["configs/demo.yaml", "--nope"],
    ],
)
def test_quick_answers_are_the_real_parse(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    quick = answer(cli.answer_quickly, argv, capsys)
    assert quick[0] is not None  # answered, without the real parse
    assert quick == answer(real_parse, argv, capsys)


def test_what_only_the_real_parse_can_tell_goes_on_to_it(capsys):
    # a valid command line, an enum list the description does not know, the defaults of a base checkpoint's meta
    for argv in (["--max_steps", "3"], ["--debug", "x"], ["--inherit_from_base", "--help"]):
        assert answer(cli.answer_quickly, argv, capsys) == (None, "", "")
