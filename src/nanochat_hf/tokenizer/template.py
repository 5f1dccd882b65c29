"""The Jinja chat template: nanochat's conversation rendering (docs/nanochat.md, section 3) for
`apply_chat_template`, built from the names and error texts of `chat_format`.

The template first validates the whole conversation with the rules and in the order of
`chat_format.check_conversation`, raising the same error texts, then renders it.
`{% generation %}` blocks cover exactly the tokens nanochat trains on (mask 1): the assistant's string content,
its text parts, its python parts with their tool tokens, and `<|assistant_end|>`. Tool output is not trained on.
One block covers a whole trained run (everything from the assistant's start or a tool output to the next tool
output or `<|assistant_end|>`), so it ends at a special token (the pre-tokenizer cannot cut a character there)
and a character split over several byte-level tokens is marked whole, whichever way transformers maps a block to
tokens (character overlap since 5.24, `char_to_token` of its first and last character before). A block is never
empty (an empty block would make transformers mark the token before it). `tools=[...]` is refused in one line:
nanochat's format has no tool definitions.
User and system content is a string or a list of text parts (``[{"type": "text", "text": ...}]``, what pipelines
and TRL send), joined as one string, as `normalize_messages` does.
"""

from __future__ import annotations

from string import Formatter

from .chat_format import (
    ASSISTANT,
    ASSISTANT_END,
    ASSISTANT_START,
    BOS,
    ERRORS,
    OUTPUT_END,
    OUTPUT_START,
    PART_TYPES,
    PYTHON,
    PYTHON_END,
    PYTHON_OUTPUT,
    PYTHON_START,
    SYSTEM,
    TEXT,
    TOOLS_ERROR,
    USER,
    USER_END,
    USER_START,
)


def _lit(text: str) -> str:
    """A Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _raise(key: str, **fields: str) -> str:
    """Jinja statement raising ERRORS[key], its fields given as Jinja expressions (quoted values via `~`, which
    writes str(value) as Python's format does)."""
    pieces = []
    for literal, name, _, _ in Formatter().parse(ERRORS[key]):
        if literal:
            pieces.append(_lit(literal))
        if name is not None:
            pieces.append(f"({fields[name]})")
    return "{{ raise_exception(" + " ~ ".join(pieces) + ") }}"


# The Python type name of a value the template sees (transformers hands it plain JSON types).
_KIND_MACRO = (
    "{%- macro kind(x) -%}"
    "{%- if x is none -%}NoneType{%- elif x is boolean -%}bool{%- elif x is integer -%}int"
    "{%- elif x is float -%}float{%- elif x is string -%}str{%- elif x is mapping -%}dict"
    "{%- else -%}list{%- endif -%}"
    "{%- endmacro -%}"
)
_TEXT_OF_MACRO = (
    "{%- macro text_of(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}{{ part['text'] }}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)
_ASSISTANT_PARTS = "[" + ", ".join(map(_lit, PART_TYPES)) + "]"

# transformers itself refuses an empty conversation and messages that are not dicts; other renderers of the
# template (llama.cpp, vLLM, ...) may not, so the template checks them too.
_VALIDATION = (
    "{%- if messages | length == 0 -%}" + _raise("empty") + "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m is not mapping or 'role' not in m or 'content' not in m -%}"
    + _raise("message", i="loop.index0")
    + "{%- endif -%}"
    "{%- endfor -%}"
    f"{{%- set start = 1 if messages[0]['role'] == {_lit(SYSTEM)} else 0 -%}}"
    f"{{%- if start == 1 and (messages | length < 2 or messages[1]['role'] != {_lit(USER)}) -%}}"
    + _raise("system_alone", i="0")
    + "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set i = loop.index0 -%}"
    f"{{%- set expected = {_lit(SYSTEM)} if i < start else ({_lit(USER)} if (i - start) % 2 == 0 "
    f"else {_lit(ASSISTANT)}) -%}}"
    "{%- if m['role'] != expected -%}" + _raise("role", i="i", role="m['role']", expected="expected") + "{%- endif -%}"
    "{%- set content = m['content'] -%}"
    "{%- if content is not string -%}"
    "{%- if content is mapping or content is not sequence -%}"
    f"{{%- if expected == {_lit(ASSISTANT)} -%}}"
    + _raise("assistant_content", i="i", kind="kind(content)")
    + "{%- else -%}"
    + _raise("text_content", i="i", role="expected", kind="kind(content)")
    + "{%- endif -%}"
    "{%- endif -%}"
    f"{{%- set allowed = {_ASSISTANT_PARTS} if expected == {_lit(ASSISTANT)} else [{_lit(TEXT)}] -%}}"
    "{%- for part in content -%}"
    "{%- set part_type = part.get('type') if part is mapping else kind(part) -%}"
    "{%- if part is not mapping or part_type not in allowed -%}"
    f"{{%- if expected == {_lit(ASSISTANT)} -%}}"
    + _raise("part", i="i", j="loop.index0", type="part_type")
    + "{%- else -%}"
    + _raise("text_part", i="i", j="loop.index0", role="expected", type="part_type")
    + "{%- endif -%}"
    "{%- elif part.get('text') is not string -%}"
    + _raise("part_text", i="i", j="loop.index0", role="expected", kind="kind(part.get('text'))")
    + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

# nanochat's chat format has no tool definitions (its one tool, the calculator, is called by python parts of the
# assistant's content): a `tools` argument is refused rather than dropped
_NO_TOOLS = "{%- if tools -%}{{ raise_exception(" + _lit(TOOLS_ERROR) + ") }}{%- endif -%}"

_RENDERING = (
    "{%- set system = text_of(messages[0]['content']) ~ '\\n\\n' if start == 1 else '' -%}"
    + BOS
    + "{%- for message in messages[start:] -%}"
    f"{{%- if message['role'] == {_lit(USER)} -%}}"
    + USER_START
    + "{{ system if loop.first else '' }}{{ text_of(message['content']) }}"
    + USER_END
    + "{%- else -%}"
    + ASSISTANT_START
    + "{%- if message['content'] is string -%}"
    "{%- generation -%}{{ message['content'] }}" + ASSISTANT_END + "{%- endgeneration -%}"
    "{%- else -%}"
    # one generation block per trained run (the parts between two tool outputs), written when the run ends
    "{%- set run = namespace(text='') -%}"
    "{%- for part in message['content'] -%}"
    f"{{%- if part['type'] == {_lit(PYTHON_OUTPUT)} -%}}"
    "{%- if run.text -%}{%- generation -%}{{ run.text }}{%- endgeneration -%}{%- endif -%}"
    "{%- set run.text = '' -%}"
    + OUTPUT_START
    + "{{ part['text'] }}"
    + OUTPUT_END
    + f"{{%- elif part['type'] == {_lit(PYTHON)} -%}}"
    f"{{%- set run.text = run.text ~ {_lit(PYTHON_START)} ~ part['text'] ~ {_lit(PYTHON_END)} -%}}"
    "{%- else -%}{%- set run.text = run.text ~ part['text'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- generation -%}{{ run.text }}" + ASSISTANT_END + "{%- endgeneration -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT_START + "{%- endif -%}"
)

CHAT_TEMPLATE = _KIND_MACRO + _TEXT_OF_MACRO + _NO_TOOLS + _VALIDATION + _RENDERING
