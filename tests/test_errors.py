"""The one-line formatter every entry point and library layer uses for the errors it reports."""

from nanochat_hf.errors import one_line


def test_one_line_keeps_the_first_line_collapsed():
    error = ValueError("model.safetensors:  header   too large\n  File 'x', line 3\n    raise")
    assert one_line(error) == "model.safetensors: header too large"


def test_an_empty_message_gives_the_error_type():
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line("") == ""
