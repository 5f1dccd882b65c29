"""The chat-format module: the one home of the special tokens, and the one validation of a conversation."""

import ast
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from nanochat_hf.data import check_messages
from nanochat_hf.tokenizer import chat_format
from nanochat_hf.tokenizer.chat_format import check_conversation, special_token_ids

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def special_literals(path: Path) -> list[str]:
    """'file:line: text' of each string constant spelling a special token, docstrings excepted."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and SPECIAL.search(node.value)
    ]


def test_special_tokens_are_spelled_only_in_the_chat_format_module():
    home = ROOT / "src" / "nanochat_hf" / "tokenizer" / "chat_format.py"
    files = [
        p for folder in ("src", "scripts", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py")) if p != home
    ]
    assert len(files) > 20
    assert [hit for p in files for hit in special_literals(p)] == []
    assert len(special_literals(home)) == len(chat_format.SPECIAL_TOKENS)


def test_the_checker_sees_code_but_not_docstrings(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        '"""Ends at <|assistant_end|>."""\n\n\ndef f():\n    """<|bos|> first."""\n'
        '    return f"{1}<|user_start|>" + "<|python_end|>"\n'
    )
    assert sorted(hit.split(": ", 1)[1] for hit in special_literals(source)) == ["'<|python_end|>'", "'<|user_start|>'"]


def test_special_tokens_in_nanochat_order(tok):
    assert chat_format.SPECIAL_TOKENS == (
        "<|bos|>",
        "<|user_start|>",
        "<|user_end|>",
        "<|assistant_start|>",
        "<|assistant_end|>",
        "<|python_start|>",
        "<|python_end|>",
        "<|output_start|>",
        "<|output_end|>",
    )
    ids = special_token_ids(tok)
    assert list(ids) == list(chat_format.SPECIAL_TOKENS)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|assistant_end|>", "<|bos|>")
    assert chat_format.STOP_TOKENS == ("<|assistant_end|>", "<|bos|>")


def test_special_token_ids_name_what_is_missing(tok):
    renamed = Tokenizer.from_str(tok.backend_tokenizer.to_str().replace("<|python_end|>", "<|not_python_end|>"))
    bare = PreTrainedTokenizerFast(tokenizer_object=renamed)
    with pytest.raises(ValueError, match=r"tokenizer lacks nanochat special tokens \['<\|python_end\|>'\]"):
        special_token_ids(bare)


GOOD = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


@pytest.mark.parametrize("messages, rules, message", [
    ([{"role": "system", "content": "s"}, *GOOD], {"allow_system": False},
     "message 0 has role 'system', expected 'user' (roles alternate)"),
    ([GOOD[0], {"role": "assistant", "content": [{"type": "text", "text": "a"}]}], {"strings_only": True},
     "message 1 (assistant) content must be a string, got list"),
    ([{"role": "user", "content": [{"type": "text", "text": "q"}]}, GOOD[1]], {"strings_only": True},
     "message 0 (user) content must be a string, got list"),
    ([GOOD[0]], {"needs_reply": True}, "conversation needs a user and an assistant message, got 1 message(s)"),
    ({"messages": GOOD}, {}, "conversation 'messages' must be a list, got dict"),
])  # fmt: skip
def test_stricter_rules(messages, rules, message):
    with pytest.raises(ValueError) as e:
        check_conversation(messages, **rules)
    assert str(e.value) == message
    if not isinstance(messages, dict):  # valid under the default rules
        assert check_conversation(messages) is messages


def test_data_check_is_the_same_validation():
    assert check_messages(GOOD) is None
    assert check_messages([GOOD[0]]) == "conversation needs a user and an assistant message, got 1 message(s)"
    bad = [GOOD[0], {"role": "assistant", "content": [{"type": "image", "text": "x"}]}]
    with pytest.raises(ValueError) as e:
        check_conversation(bad)
    assert check_messages(bad) == str(e.value)
    # identity files: nanochat's stricter rule
    system = [{"role": "system", "content": "s"}, *GOOD]
    assert check_messages(system) is None
    assert check_messages(system, allow_system=False, strings_only=True).startswith("message 0 has role 'system'")
