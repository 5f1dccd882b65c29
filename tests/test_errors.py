"""The one-line formatter every entry point and library layer uses for the errors it reports."""

import pytest

from nanochat_hf.errors import OneLineArgumentParser, UserError, one_line, run_cli


def test_one_line_keeps_the_first_line_collapsed():
    error = ValueError("model.safetensors:  header   too large\n  File 'x', line 3\n    raise")
    assert one_line(error) == "model.safetensors: header too large"


def test_an_empty_message_gives_the_error_type():
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line("") == ""


def test_run_cli_turns_user_and_path_errors_into_one_line_and_exit_2(capsys, monkeypatch):
    def bad_value():
        raise UserError("config.json: field n_layer is 'x'; expected an integer\n(more detail)")

    def missing_path():
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/model.safetensors")

    assert run_cli("convert", bad_value) == 2
    assert capsys.readouterr().err == "convert: error: config.json: field n_layer is 'x'; expected an integer\n"
    assert run_cli("chat", missing_path) == 2
    assert capsys.readouterr().err == "chat: error: [Errno 2] No such file or directory: '/nowhere/model.safetensors'\n"
    assert run_cli("chat", lambda: None) == 0
    monkeypatch.setenv("RANK", "1")  # another rank: same exit code, nothing printed
    assert run_cli("chat", missing_path) == 2
    assert capsys.readouterr().err == ""


def test_a_bug_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        run_cli("chat", lambda: 1 / 0)


def test_argument_errors_read_the_same_way(capsys):
    parser = OneLineArgumentParser(prog="preview_data")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--n", "many"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(
        "preview_data: error: argument --n: invalid int value: 'many' (see --help)\n"
    )


def test_other_ranks_exit_the_same_without_a_line(capsys, monkeypatch):
    def no_task():
        raise UserError("--tasks: no task given")

    monkeypatch.setenv("RANK", "1")  # torchrun / accelerate launch: rank 0 says it
    assert run_cli("chat_eval", no_task) == 2
    parser = OneLineArgumentParser(prog="chat_eval")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--n", "many"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["--device-batch-size=8"], ["--device-batch-size", "8"]])
def test_a_flag_spelled_with_dashes_names_the_flag(capsys, argv):
    """nanochat spells its flags with dashes; our commands keep its names with underscores: the error says which."""
    parser = OneLineArgumentParser(prog="chat_rl")
    parser.add_argument("--device_batch_size", type=int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"chat_rl: error: unrecognized arguments: {' '.join(argv)}; did you mean --device_batch_size? (see --help)\n"
    )
    with pytest.raises(SystemExit):  # a flag that is no known flag in any spelling: no guess
        parser.parse_args(["--device-batches=8"])
    assert "did you mean" not in capsys.readouterr().err


def _entry_point(script: str, load_script):
    """The function a command parses its arguments with, in this process."""
    if script == "chat_rl":
        from nanochat_hf.rl.arguments import parse_args
    elif script == "mid_train":
        from nanochat_hf.training.arguments import parse_args
    elif script == "mid_train (quick)":
        from nanochat_hf.training.cli import answer_quickly as parse_args
    else:
        parse_args = load_script(script).parse_args
    return parse_args


@pytest.mark.parametrize(
    "script, argv, flag",
    [
        ("chat_rl", ["configs/rl_demo.yaml", "--device-batch-size=8"], "--device_batch_size"),
        ("chat_rl", ["--model_source", "m", "--top-k", "5"], "--top_k"),
        ("chat_eval", ["--model", "m", "--max-problems", "3"], "--max_problems"),
        ("chat", ["--model", "m", "--max_new_tokens=3"], "--max-new-tokens"),
        ("preview_data", ["--device_batch_size", "8"], "--device-batch-size"),
        ("mid_train", ["--device-batch-size=8", "--max-seq_len=64"], "--max_seq_len"),
        ("mid_train (quick)", ["--device-batch-size=8", "--max-seq_len=64"], "--max_seq_len"),
        ("convert", ["to-nanochat", "--model", "m", "--output", "o", "--tokenizer_output", "t"], "--tokenizer-output"),
    ],
)
def test_every_command_names_the_flag(script, argv, flag, load_script, capsys):
    """Each command's parser (all are OneLineArgumentParser) says the name. mid_train also takes nanochat's dashed
    names (transformers' parser adds them), so there only a mixed spelling reaches the hint."""
    with pytest.raises(SystemExit) as exit_:
        _entry_point(script, load_script)(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"; did you mean {flag}? (see --help)")
