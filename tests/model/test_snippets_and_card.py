"""The README's loading snippet and the model card's: metadata, and the code runs as written in a fresh process
without the package, with no interactive trust_remote_code prompt."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import ModelCard

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.evaluation.chat_eval import TaskScore
from nanochat_hf.tokenizer import train_tokenizer
from nanochat_hf.training.report import write_model_card

from .conftest import randomize

README = Path(__file__).resolve().parents[2] / "README.md"
PROMPT = "Do you wish to run the custom code"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tokenizer = train_tokenizer(["Spell the word: apple, banana. hello there!"] * 5, vocab_size=300)
    config = NanoChatGPTConfig(
        sequence_len=64,
        vocab_size=len(tokenizer),
        n_layer=1,
        n_head=2,
        n_embd=32,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("model")
    randomize(NanoChatGPTForCausalLM(config)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def python_block(markdown: str, after: str) -> str:
    return re.search(r"```python\n(.*?)```", markdown[markdown.index(after) :], re.S).group(1)


def card_args(**kw) -> SimpleNamespace:
    defaults = dict(
        model_source="demo", train_mixture=None, demo_depth=2, total_batch_size=512, max_seq_len=64, hub_model_id=None
    )
    return SimpleNamespace(**{**defaults, **kw})


def fake_trainer(args, chat_eval_scores: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        args=args,
        state=SimpleNamespace(global_step=3, log_history=[{"eval_val_bpb": 2.5}]),
        min_val_bpb=2.5,
        chat_eval_scores=chat_eval_scores or [],
    )


BACKBONE_AND_CLASSIFIER = """
import torch
from transformers import AutoModel, AutoModelForSequenceClassification
backbone = AutoModel.from_pretrained(MODEL, trust_remote_code=True)
classifier = AutoModelForSequenceClassification.from_pretrained(MODEL, trust_remote_code=True, num_labels=2)
out = backbone(torch.tensor([[1, 2, 3]]), output_hidden_states=True)
print(type(backbone).__name__, type(classifier).__name__, type(backbone).__module__.split(".")[0],
      len(out.hidden_states))
"""
# each piece of code exec'd as written, in its own globals (an import a snippet lacks fails it), one after the other
# in one fresh interpreter; a line on stdout and stderr before each splits their output
EACH_IN_ITS_OWN_GLOBALS = """
import json, sys, traceback
for i, code in enumerate(json.loads(sys.argv[1])):
    print(f"=== {i}", flush=True)
    print(f"=== {i}", file=sys.stderr, flush=True)
    try:
        exec(compile(code, f"<code {i}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        print("FAILED", flush=True)
"""


@pytest.mark.slow
def test_snippets_and_remote_code_classes_in_a_fresh_process(model_dir, fresh_python):
    """Slow: one fresh interpreter without the package (python -I, no stdin) runs, as written: the model card's
    loading snippet and the README's, each with no trust_remote_code prompt, and AutoModel /
    AutoModelForSequenceClassification loading the folder as remote code."""
    import json

    card = write_model_card(fake_trainer(card_args()), model_dir)
    card_code = python_block(card.read_text(), "## How to load")
    assert f'"{model_dir.resolve()}"' in card_code
    readme_code = python_block(README.read_text(), "## Pushing to the hub, loading and chatting")
    assert '"you/nanochat-d20-mid"' in readme_code
    codes = [card_code, readme_code.replace("you/nanochat-d20-mid", str(model_dir))]
    codes.append(f"MODEL = {str(model_dir)!r}\n" + BACKBONE_AND_CLASSIFIER)
    result = fresh_python(EACH_IN_ITS_OWN_GLOBALS, json.dumps(codes))
    assert result.returncode == 0, result.stderr[-3000:]
    outs, errs = (re.split(r"^=== \d+\n", text, flags=re.M)[1:] for text in (result.stdout, result.stderr))
    assert len(outs) == len(errs) == 3, result.stderr[-3000:]
    for out, err in zip(outs, errs):
        assert "FAILED" not in out, err[-3000:]
        assert PROMPT not in out + err
    assert outs[2].split() == [
        "NanoChatGPTModel",
        "NanoChatGPTForSequenceClassification",
        "transformers_modules",
        "2",
    ]


def test_model_card_metadata(tmp_path):
    mixture = tmp_path / "mix.yaml"
    local = tmp_path / "gsm8k.jsonl"
    local.write_text('{"question": "1+1?", "answer": "2\\n#### 2"}\n')
    mixture.write_text(
        "tasks:\n  - {task: smoltalk}\n  - {task: mmlu}\n  - {task: smoltalk, start: 5}\n"
        f"  - {{task: gsm8k, data_files: [{local}]}}\n  - {{task: simple_spelling, size: 10}}\n"
    )
    path = write_model_card(
        fake_trainer(card_args(model_source="someone/nanochat-d20", train_mixture=str(mixture))), tmp_path / "out"
    )
    data = ModelCard.load(path).data
    assert data.base_model == "someone/nanochat-d20"
    assert data.datasets == ["HuggingFaceTB/smol-smoltalk", "cais/mmlu"]  # local files and synthetic rows: none
    assert (data.license, data.language, data.pipeline_tag) == ("mit", ["en"], "text-generation")
    assert {"nanochat", "mid-training"} <= set(data.tags) and data.library_name == "transformers"
    # a local base model and the demo mixture: nothing to link
    demo = ModelCard.load(write_model_card(fake_trainer(card_args(model_source=str(tmp_path))), tmp_path / "d")).data
    assert demo.base_model is None and demo.datasets is None


def test_model_card_carries_the_chat_eval_as_model_index(tmp_path):
    scores = [TaskScore("SpellingBee", "generative", 0.4375, 0.0, 32)]
    path = write_model_card(fake_trainer(card_args(model_source="someone/nanochat-d20"), scores), tmp_path / "out")
    card = ModelCard.load(path)
    (entry,) = card.data.to_dict()["model-index"]
    (result,) = entry["results"]
    assert result["dataset"]["name"] == "SpellingBee" and result["metrics"][0]["value"] == pytest.approx(0.4375)
    assert "SpellingBee" in card.text  # the table in the card body
