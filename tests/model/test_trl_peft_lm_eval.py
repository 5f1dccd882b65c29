"""The libraries around transformers on a tiny model: TRL's SFTTrainer (assistant-only loss, its fused loss with
the softcap), PEFT LoRA (all-linear and by name; adapter saved and reloaded) and lm-eval's HFLM (scores after
<|bos|>)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.tokenizer import render_conversation, train_tokenizer

from .conftest import randomize

peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")

CONVERSATIONS = [
    [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, how are you?"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "jumps over the lazy dog."},
    ],
    [
        {"role": "user", "content": "count to three"},
        {"role": "assistant", "content": "one two three"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "one, two, three."},
    ],
    [{"role": "user", "content": "what is the fox?"}, {"role": "assistant", "content": "a quick brown animal."}],
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [m["content"] for conv in CONVERSATIONS for m in conv] * 4
    return train_tokenizer(texts, vocab_size=320)


def tiny_model(tokenizer, seed: int = 0) -> NanoChatGPTForCausalLM:
    config = NanoChatGPTConfig(
        sequence_len=128,
        vocab_size=len(tokenizer),
        n_layer=2,
        n_head=2,
        n_embd=32,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return randomize(NanoChatGPTForCausalLM(config), seed)


def sft_config(tmp_path, **kw):
    return trl.SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        assistant_only_loss=True,
        max_length=128,
        dataloader_num_workers=0,
        seed=0,
        bf16=False,
        **kw,
    )


def test_sft_trainer_assistant_only_loss(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = trl.SFTTrainer(
        model=model,
        args=sft_config(tmp_path),
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"messages": c} for c in CONVERSATIONS]),
    )
    # the labels TRL trains on are exactly the tokens nanochat's renderer marks (assistant replies + their end)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, mask = render_conversation(tokenizer, {"messages": CONVERSATIONS[0]})
    assert batch["input_ids"][0].tolist() == ids
    assert (batch["labels"][0] != -100).long().tolist() == mask
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_trl_fused_loss_sees_the_softcap(tokenizer):
    # SFTTrainer's default loss runs the backbone and the LM head itself, reading final_logit_softcapping
    from trl.trainer.utils import add_fused_lm_head

    model = tiny_model(tokenizer).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits far beyond the cap: without it the loss differs a lot
    ids = torch.tensor([render_conversation(tokenizer, {"messages": CONVERSATIONS[1]})[0]])
    with torch.no_grad():
        ours = model(ids, labels=ids).loss
        uncapped = torch.nn.functional.cross_entropy(
            model.lm_head(model.transformer(ids).last_hidden_state)[0, :-1], ids[0, 1:]
        )
        add_fused_lm_head(model)
        fused = model(ids, labels=ids, fused_lm_head=True).loss
    assert abs(ours.item() - uncapped.item()) > 1.0
    assert abs(fused.item() - ours.item()) < 1e-4


def test_sft_trainer_with_lora_all_linear_saves_an_adapter_that_reloads(tokenizer, tmp_path):
    base_dir = tmp_path / "base"
    tiny_model(tokenizer).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    trainer = trl.SFTTrainer(
        model=model,
        args=sft_config(tmp_path),
        processing_class=tokenizer,
        peft_config=lora,
        train_dataset=Dataset.from_list([{"messages": c} for c in CONVERSATIONS]),
    )
    targeted = trainer.model.peft_config["default"].target_modules
    # every linear layer of the blocks, not the LM head
    assert len(targeted) == 2 * 6 and {t.rsplit(".", 1)[-1] for t in targeted} == {
        "c_q",
        "c_k",
        "c_v",
        "c_proj",
        "c_fc",
    }
    trainer.train()
    trainer.model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([render_conversation(tokenizer, {"messages": CONVERSATIONS[2]})[0]])
    trained = trainer.model.eval()
    reloaded = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapter"
    ).eval()
    plain = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        assert torch.allclose(reloaded(input_ids=ids).logits, expected, atol=1e-5)
        assert not torch.allclose(plain(ids).logits, expected, atol=1e-3)  # the adapter does something


def test_lora_by_module_name(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["c_q", "c_v"], init_lora_weights=False))
    names = {n.split(".lora_A")[0] for n, _ in lora.named_parameters() if "lora_A" in n}
    assert names == {f"base_model.model.transformer.h.{i}.attn.{m}" for i in range(2) for m in ("c_q", "c_v")}
    lora.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[tokenizer.bos_token_id, 5, 6, 7]])
    with torch.no_grad():
        expected = lora(input_ids=ids).logits
    reloaded = peft.PeftModel.from_pretrained(tiny_model(tokenizer), tmp_path / "adapter")
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, expected, atol=1e-5)


def test_lm_eval_hflm_scores_after_bos(tokenizer, tmp_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model = tiny_model(tokenizer).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = HFLM(pretrained=str(tmp_path), device="cpu", batch_size=1)
    context, continuation = "the quick brown", " fox jumps"
    request = Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)
    ((score, _),) = lm.loglikelihood([request], disable_tqdm=True)

    def logprob(prefix: list[int]) -> float:
        ctx = prefix + tokenizer.encode(context, add_special_tokens=False)
        cont = tokenizer.encode(context + continuation, add_special_tokens=False)[len(ctx) - len(prefix) :]
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = model(ids).logits[0, :-1].log_softmax(-1)
        return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))

    assert abs(score - logprob([tokenizer.bos_token_id])) < 1e-4
    assert abs(score - logprob([])) > 1e-3  # without <|bos|> the score differs
    assert AutoTokenizer.from_pretrained(tmp_path)(context)["input_ids"][0] == tokenizer.bos_token_id
