"""The same script and config on a small Llama-shaped model with its own chat template (no nanochat tokens): its
template renders the prompts, it stops at its eos token, GRPO on offline GSM8K-layout problems runs to the end and
saves a model AutoModelForCausalLM reloads; asking it for nanochat's calculator is one line."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from nanochat_hf.errors import UserError
from nanochat_hf.rl.rollout import NanoChatRollout
from nanochat_hf.rl.run import main
from nanochat_hf.tasks.demo import arithmetic_row

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    rows = [arithmetic_row(i, "train") for i in range(200)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [r["question"] + " " + r["answer"] for r in rows],
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=TEMPLATE
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    out = tmp_path_factory.mktemp("llama")
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow
def test_grpo_on_gsm8k_with_the_models_own_template(llama_dir, tmp_path, capsys):
    """Slow: a whole GRPO run through TRL (sampling, rewards, evaluations) on a Llama."""
    out = tmp_path / "out"
    flags = ["--model_source", str(llama_dir), "--gsm8k_source", "demo", "--demo_rows", "6", "--calculator", "false"]
    flags += ["--examples_per_step", "2", "--num_samples", "4", "--device_batch_size", "2", "--max_new_tokens", "8"]
    flags += ["--eval_every", "2", "--eval_examples", "2", "--output_dir", str(out)]
    assert main(flags) == 0
    printed = capsys.readouterr().out
    assert "step 00003/00003 (100.00%)" in printed and "step 00002 | pass@k on 2 problems" in printed
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    rollout = NanoChatRollout(tok, 2, 8, 1.0, 50, calculator=False, max_sequence_len=256)
    prompt = rollout.prompt_ids([{"role": "user", "content": "What is 2+3?"}])
    assert tok.decode(prompt) == "<s>user: What is 2+3?</s><s>assistant: "
    assert rollout.stops == {tok.eos_token_id}
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "LlamaForCausalLM"


def test_calculator_without_its_tokens_is_one_line(llama_dir):
    tok = PreTrainedTokenizerFast.from_pretrained(llama_dir)
    with pytest.raises(UserError, match="calculator=true needs nanochat's calculator tokens") as e:
        NanoChatRollout(tok, 2, 8, 1.0, 50, calculator=True, max_sequence_len=256)
    assert "\n" not in str(e.value) and "calculator false" in str(e.value)


def test_a_model_without_chat_template_is_one_line(llama_dir, tmp_path, capsys):
    """A tokenizer with neither nanochat's tokens nor a chat template cannot render a prompt: one line naming
    the model folder, exit 2, nothing written."""
    import json
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(llama_dir, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    out = tmp_path / "out"
    flags = ["--model_source", str(bare), "--gsm8k_source", "demo", "--demo_rows", "6", "--calculator", "false"]
    assert main([*flags, "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err  # (transformers' bar of the weights loading before it, on stderr too)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"chat_rl: error: model_source={bare}: its tokenizer has no chat template (chat_template in "
        "tokenizer_config.json, or chat_template.jinja) and not nanochat's special tokens; chat_rl renders each "
        "GSM8K problem as a chat prompt with one of them"
    )
    assert not out.exists()
