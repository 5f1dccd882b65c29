"""Bad input to chat_rl, one line each, before anything is written: samples that do not divide into passes,
prompts per step that do not divide across processes, a prompt longer than the context, a reward function of
the wrong length or type, a config with an unknown knob, a checkpoint that is not one."""

import re
import sys

import pytest

from nanochat_hf.errors import UserError
from nanochat_hf.rl.arguments import parse_args
from nanochat_hf.rl.rewards import checked_reward
from nanochat_hf.rl.run import main

from .conftest import REPO_ROOT, tiny_args


def one_line_exit(capsys, argv: list[str]) -> str:
    """chat_rl's exit code 2 and its one stderr line (argument errors exit through argparse, others return 2)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("chat_rl: error: ")
    return line


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"num_samples": "6"}, "num_samples=6 must be a positive multiple of device_batch_size=4"),
        ({"max_new_tokens": "250"}, "exceeds the model's context (256 tokens)"),
        ({"resume_from_checkpoint": "nowhere"}, "resume_from_checkpoint=nowhere: not a complete checkpoint folder"),
        ({"gsm8k_source": "web"}, "gsm8k_source='web': expected hub, demo or files"),
        ({"temperature": "-1"}, "temperature=-1.0: expected a number >= 0 (0: greedy)"),
        ({"temperature": "nan"}, "temperature=nan: expected a number >= 0 (0: greedy)"),
        ({"top_k": "-5"}, "top_k=-5: expected 0 (off) or a positive number of tokens"),
        ({"eval_every": "2", "eval_examples": "0"}, "eval_examples=0: expected at least 1 (or eval_every -1"),
        ({"num_threads": "0"}, "num_threads=0: expected 1 to "),
    ],
)
def test_bad_flags_are_one_line(capsys, tmp_path, flags, words):
    out = tmp_path / "out"
    assert words in one_line_exit(capsys, tiny_args(out, **flags))
    assert not out.exists()  # nothing written


def test_unknown_knob_in_the_config_is_one_line(capsys, tmp_path):
    config = tmp_path / "rl.yaml"
    config.write_text("num_samples: 16\nnum_generations: 16\n")
    assert "unknown argument(s) num_generations" in one_line_exit(capsys, [str(config)])
    config.write_text("num_samples: sixteen\n")
    assert "num_samples='sixteen': expected an integer" in one_line_exit(capsys, [str(config)])


def test_examples_per_step_not_divisible_by_the_processes(tmp_path):
    args = parse_args(tiny_args(tmp_path))
    with pytest.raises(UserError, match="examples_per_step=2 is not divisible by the 3 processes"):
        args.grpo_config(num_train_rows=10, world_size=3)


@pytest.mark.parametrize(
    "returned, words",
    [
        ([1.0], "returned 1 values; expected a list of 2 floats"),
        (1.0, "returned float; expected a list of 2 floats"),
        ("10", "returned str; expected a list of 2 floats"),
        ([1.0, "1"], "returned '1' (str); expected finite floats or None"),
        ([1.0, float("nan")], "returned nan (float); expected finite floats or None"),
    ],
)
def test_reward_of_wrong_length_or_type_is_one_line(returned, words):
    def bad(**kwargs):
        return returned

    reward = checked_reward(bad)
    with pytest.raises(UserError, match=rf"reward function bad {words}".replace("(", r"\(").replace(")", r"\)")):
        reward(prompts=["a", "b"], completions=["x", "y"], completion_ids=[[1], [2]])
    assert checked_reward(lambda **k: [0.5, None])(completion_ids=[[1], [2]]) == [0.5, None]


def test_without_trl_the_install_command_is_one_line(capsys, tmp_path, monkeypatch):
    """`pip install -e .` (the README's set-up) leaves TRL out: chat_rl names the extra that brings it, and that
    extra is in pyproject.toml."""
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now fails as where it is not installed
    out = tmp_path / "out"
    line = one_line_exit(capsys, tiny_args(out))
    assert line == (
        "chat_rl: error: No module named 'trl': the RL stage runs on TRL's GRPOTrainer; install the rl extra: "
        'pip install -e ".[rl]" (from the repository root)'
    )
    assert not out.exists()
    assert re.search(r'^rl = \["trl>=', (REPO_ROOT / "pyproject.toml").read_text(), re.M)  # the extra it names
