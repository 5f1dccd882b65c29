"""The chat template's assistant mask (`return_assistant_tokens_mask`, so TRL's assistant_only_loss) is nanochat's
renderer's mask, non-ASCII text and tool parts included.

data/nanochat_render.json holds (ids, mask) written by nanochat's own tokenizer.render_conversation with the
tokenizer its tok_train.py wrote (data/nanochat_92d63d4; see data/README.md).
"""

import json
import random
from pathlib import Path

import pytest
from jinja2.exceptions import TemplateError
from transformers.utils.chat_template_utils import render_jinja_template

from nanochat_hf.tokenizer import load_nanochat_tokenizer, render_conversation
from nanochat_hf.tokenizer.chat_format import TOOLS_ERROR

from .conftest import random_text

DATA = Path(__file__).parent / "data"
RENDERED = json.loads((DATA / "nanochat_render.json").read_text())


@pytest.fixture(scope="module")
def nanochat_tok():
    return load_nanochat_tokenizer(DATA / "nanochat_92d63d4", trust_pickle=True)


def template_mask(tok, messages):
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return out["input_ids"], out["assistant_masks"]


def template_mask_before_5_24(tok, messages):
    """The mask as transformers 5.0-5.23 computed it: every token from char_to_token of a block's first character
    to char_to_token of its last (the first token holding it); 5.24 marks every token a block overlaps."""
    (rendered,), (blocks,) = render_jinja_template(
        conversations=[messages],
        chat_template=tok.chat_template,
        return_assistant_tokens_mask=True,
        **tok.special_tokens_map,
    )
    enc = tok(rendered, add_special_tokens=False)
    mask = [0] * len(enc.input_ids)
    for start_char, end_char in blocks:
        start, end = enc.char_to_token(start_char), enc.char_to_token(end_char - 1)
        for t in range(start, end + 1):
            mask[t] = 1
    return enc.input_ids, mask


@pytest.mark.parametrize("case", RENDERED, ids=range(len(RENDERED)))
def test_nanochat_renderer_output(nanochat_tok, case):
    messages = case["conversation"]["messages"]
    assert render_conversation(nanochat_tok, case["conversation"]) == (case["ids"], case["mask"])
    assert template_mask(nanochat_tok, messages) == (case["ids"], case["mask"])
    # older transformers too, except where a text part ending in a character split over tokens is followed
    # directly by a tool output (case 4: "Computing 😀" then python_output): there it misses the last pieces
    ids, mask = template_mask_before_5_24(nanochat_tok, messages)
    assert ids == case["ids"] and (mask == case["mask"]) == (case is not RENDERED[4])


def random_conversation(rng: random.Random) -> dict:
    messages = [{"role": "system", "content": random_text(rng, rng.randint(0, 6))}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 2)):
        messages.append({"role": "user", "content": random_text(rng, rng.randint(0, 10))})
        if rng.random() < 0.3:
            messages.append({"role": "assistant", "content": random_text(rng, rng.randint(0, 16))})
            continue
        parts, last = [], None
        for _ in range(rng.randint(1, 6)):
            kind = rng.choice([k for k in ("text", "python", "python_output") if not (k == last == "text")])
            parts.append({"type": kind, "text": random_text(rng, rng.randint(0, 10))})
            last = kind
        messages.append({"role": "assistant", "content": parts})
    return {"messages": messages}


def test_random_unicode_conversations_with_tool_parts(nanochat_tok):
    # (two adjacent text parts are left out: the template tokenizes them as one string, see chat.py)
    rng = random.Random(0)
    for _ in range(150):
        conv = random_conversation(rng)
        expected = render_conversation(nanochat_tok, conv, max_tokens=None)
        assert template_mask(nanochat_tok, conv["messages"]) == expected, conv
        if template_mask_before_5_24(nanochat_tok, conv["messages"]) != expected:  # only where case 4 differs
            assert any(
                a["type"] == "text" and b["type"] == "python_output" and a["text"]
                for m in conv["messages"]
                if isinstance(m["content"], list)
                for a, b in zip(m["content"], m["content"][1:])
            ), conv


def test_trl_assistant_only_loss_trains_on_nanochats_mask(nanochat_tok, tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    model = NanoChatGPTForCausalLM(
        NanoChatGPTConfig(sequence_len=128, vocab_size=len(nanochat_tok), n_layer=1, n_head=2, n_kv_head=2, n_embd=64)
    )
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        assistant_only_loss=True,
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
    )
    # Arrow wants one content type: strings as one text part each (the same tokens, in nanochat's format too)
    as_parts = [
        [
            {
                **m,
                "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"],
            }
            for m in case["conversation"]["messages"]
        ]
        for case in RENDERED
    ]
    data = Dataset.from_list([{"messages": messages} for messages in as_parts])
    trainer = trl.SFTTrainer(model=model, args=args, processing_class=nanochat_tok, train_dataset=data)
    for row, case in zip(trainer.train_dataset, RENDERED):
        assert row["input_ids"] == case["ids"]
        assert [int(label != -100) for label in row["labels"]] == case["mask"]  # what the loss is taken on


def test_tools_are_refused_in_one_line_not_dropped(nanochat_tok):
    messages = RENDERED[0]["conversation"]["messages"]
    tool = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {}}}
    with pytest.raises(TemplateError) as e:
        nanochat_tok.apply_chat_template(messages, tools=[tool], tokenize=False)
    assert str(e.value) == TOOLS_ERROR and "\n" not in TOOLS_ERROR
    plain = nanochat_tok.apply_chat_template(messages, tokenize=False)
    assert nanochat_tok.apply_chat_template(messages, tools=None, tokenize=False) == plain
    assert nanochat_tok.apply_chat_template(messages, tools=[], tokenize=False) == plain
