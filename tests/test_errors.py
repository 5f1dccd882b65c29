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
