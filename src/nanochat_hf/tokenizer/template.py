"""The Jinja chat template: nanochat's conversation rendering (docs/nanochat.md, section 3) for
`apply_chat_template`.

`{% generation %}` blocks cover exactly the tokens nanochat trains on (mask 1): the assistant's string content,
its text parts, its python parts with their tool tokens, and `<|assistant_end|>`. Tool output is not trained on.
A block is never empty (an empty block would make transformers mark the token before it).
User and system content is a string or a list of text parts (``[{"type": "text", "text": ...}]``, what pipelines
and TRL send), joined as one string, as `normalize_messages` does.
"""

CHAT_TEMPLATE = (
    "{%- macro text_of(content, where) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] != 'text' or part['text'] is not string -%}"
    "{{ raise_exception(where ~ ' part ' ~ loop.index0 ~ ' must be a text part with a string text') }}"
    "{%- endif -%}{{ part['text'] }}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if messages | length == 0 -%}{{ raise_exception('conversation is empty') }}{%- endif -%}"
    "{%- set ns = namespace(start=0, system='') -%}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages | length < 2 or messages[1]['role'] != 'user' -%}"
    "{{ raise_exception('a system message must be followed by a user message') }}"
    "{%- endif -%}"
    "{%- set ns.start = 1 -%}"
    "{%- set ns.system = text_of(messages[0]['content'], 'message 0 (system) content') ~ '\\n\\n' -%}"
    "{%- endif -%}"
    "<|bos|>"
    "{%- for message in messages[ns.start:] -%}"
    "{%- set expected = 'user' if loop.index0 % 2 == 0 else 'assistant' -%}"
    "{%- if message['role'] != expected -%}"
    "{{ raise_exception('message ' ~ (loop.index0 + ns.start) ~ ' has role ' ~ message['role'] ~ ', expected ' ~ expected) }}"
    "{%- endif -%}"
    "{%- if expected == 'user' -%}"
    "<|user_start|>{{ ns.system if loop.first else '' }}"
    "{{ text_of(message['content'], 'message ' ~ (loop.index0 + ns.start) ~ ' (user) content') }}<|user_end|>"
    "{%- else -%}"
    "<|assistant_start|>"
    "{%- if message['content'] is string -%}"
    "{%- generation -%}{{ message['content'] }}<|assistant_end|>{%- endgeneration -%}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}"
    "{%- if part['text'] -%}{%- generation -%}{{ part['text'] }}{%- endgeneration -%}{%- endif -%}"
    "{%- elif part['type'] == 'python' -%}"
    "{%- generation -%}<|python_start|>{{ part['text'] }}<|python_end|>{%- endgeneration -%}"
    "{%- elif part['type'] == 'python_output' -%}"
    "<|output_start|>{{ part['text'] }}<|output_end|>"
    "{%- else -%}"
    "{{ raise_exception('unknown assistant part type ' ~ part['type']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- generation -%}<|assistant_end|>{%- endgeneration -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant_start|>{%- endif -%}"
)
