"""`NanoChatOptimizerMixin` in transformers' Trainer and TRL's SFTTrainer, DPOTrainer and GRPOTrainer on a tiny
random Llama (no downloads): the optimizer is ours, the routing printed once, the schedule scales every group in
proportion, Muon's momentum warms up; an SFT epoch lowers the loss in both recipes, its checkpoint resumes with
identical losses and the model reloads with AutoModelForCausalLM; a resume with another recipe or grouping is
refused."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

from nanochat_hf.errors import UserError
from nanochat_hf.integration import NanoChatOptimizerMixin
from nanochat_hf.optim import MuonAdamW, NorMuonAdamW
from nanochat_hf.tokenizer import train_tokenizer

trl = pytest.importorskip("trl")

WORDS = "the quick brown fox jumps over the lazy dog one two three four five six seven eight nine ten".split()
CONVERSATIONS = [
    [
        {"role": "user", "content": " ".join(WORDS[i : i + 3])},
        {"role": "assistant", "content": " ".join(WORDS[i + 3 : i + 7])},
    ]
    for i in range(12)
]
COMMON = dict(report_to=[], use_cpu=True, seed=0, bf16=False, dataloader_num_workers=0, disable_tqdm=True)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([m["content"] for c in CONVERSATIONS for m in c] * 4, vocab_size=300)


def tiny_llama(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config)


class NanoTrainer(NanoChatOptimizerMixin, Trainer):
    pass


class NanoSFT(NanoChatOptimizerMixin, trl.SFTTrainer):
    pass


class NanoDPO(NanoChatOptimizerMixin, trl.DPOTrainer):
    pass


class NanoGRPO(NanoChatOptimizerMixin, trl.GRPOTrainer):
    pass


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_plain_trainer_schedule_and_momentum(tokenizer, tmp_path, capsys):
    ids = [tokenizer.encode(" ".join(WORDS[i : i + 8]))[:8] for i in range(8)]
    data = Dataset.from_list([{"input_ids": x, "labels": x} for x in ids])
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        lr_scheduler_type="linear",
        warmup_steps=1,
        logging_steps=1,
        save_strategy="no",
        max_grad_norm=0.5,
        **COMMON,
    )
    trainer = NanoTrainer(model=tiny_llama(tokenizer), args=args, train_dataset=data)
    trainer.train()
    opt = trainer.optimizer.optimizer  # inside Accelerate's wrapper
    assert type(opt) is MuonAdamW
    out = capsys.readouterr().out
    assert out.count("optimizer recipe 2025-12 (roles routing)") == 1 and "muon/matrix" in out
    # the linear schedule scaled every group by the same factor; momentum followed nanochat's warm-up
    factors = {g["lr"] / g["initial_lr"] for g in opt.param_groups}
    assert len({round(f, 12) for f in factors}) == 1
    assert [g["momentum"] for g in opt.param_groups if g["kind"] == "muon"] == [pytest.approx(0.85 + 0.1 * 3 / 300)]
    # clipping happened in the optimizer, on the averaged gradient; the log shows its norm
    assert opt.max_grad_norm == 0.5
    assert [h["grad_norm"] for h in trainer.state.log_history if "loss" in h][-1] == opt.last_grad_norm


def _sft(tokenizer, tmp_path, recipe, **kw):
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        num_train_epochs=1,
        per_device_train_batch_size=2,
        logging_steps=1,
        max_length=64,
        save_strategy="steps",
        save_steps=3,
        **COMMON,
        **kw,
    )
    return NanoSFT(
        model=tiny_llama(tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"messages": c} for c in CONVERSATIONS]),
        nanochat_optimizer={"recipe": recipe, "init_lr_frac": 0.5},
    )


@pytest.fixture(scope="module")
def sft_epoch(tokenizer, tmp_path_factory):
    """sft_epoch(recipe): (trainer, its folder) of one SFT epoch in that recipe (6 steps, checkpoints at 3 and 6),
    trained once for the tests that read it."""
    runs = {}

    def run(recipe):
        if recipe not in runs:
            folder = tmp_path_factory.mktemp(f"sft{recipe}")
            trainer = _sft(tokenizer, folder, recipe)
            trainer.train()
            runs[recipe] = trainer, folder
        return runs[recipe]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_sft_epoch_lowers_loss_resumes_identically_and_reloads(tokenizer, sft_epoch, recipe):
    """slow: a whole SFT epoch, then half of it again from the checkpoint (seconds); the other Trainer tests here
    take a few steps."""
    trainer, tmp_path = sft_epoch(recipe)
    assert type(trainer.optimizer.optimizer) is (MuonAdamW if recipe == "2025-12" else NorMuonAdamW)
    losses = _losses(trainer)
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2]), losses
    ckpt = tmp_path / "checkpoint-3"
    assert (ckpt / "optimizer.rank0.safetensors").is_file() and not (ckpt / "optimizer.pt").exists()
    resumed = _sft(tokenizer, tmp_path / "resumed", recipe)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert len(_losses(resumed)) == 6  # the checkpoint's 3 logged losses, then the 3 of this run
    assert _losses(resumed) == pytest.approx(losses, rel=1e-6, abs=1e-7)
    trainer.save_model(str(tmp_path / "final"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters()):
        assert torch.equal(p.detach(), q.detach()), name


@pytest.mark.slow
def test_resume_with_another_recipe_or_grouping_is_refused(tokenizer, sft_epoch, tmp_path):
    """The 2025-12 epoch's checkpoint at step 3, resumed in recipe 2026-07 and with lm_head routed to Muon (slow:
    the epoch, shared with the test above)."""
    ckpt = sft_epoch("2025-12")[1] / "checkpoint-3"
    other = _sft(tokenizer, tmp_path, "2026-07", max_steps=4)
    with pytest.raises(UserError, match="optimizer state of recipe 2025-12, this run's is 2026-07"):
        other.train(resume_from_checkpoint=str(ckpt))
    regrouped = _sft(tokenizer, tmp_path, "2025-12", max_steps=4)
    regrouped.nanochat_optimizer_kwargs["roles"] = {"lm_head.weight": "matrix"}  # lm_head to Muon
    with pytest.raises(UserError, match="checkpoint-3/optimizer.rank0.safetensors: a checkpoint of another model or"):
        regrouped.train(resume_from_checkpoint=str(ckpt))


def test_dpo_trainer(tokenizer, tmp_path):
    pairs = [
        {"prompt": " ".join(WORDS[i : i + 3]), "chosen": " " + WORDS[i + 3], "rejected": " " + WORDS[i + 5]}
        for i in range(8)
    ]
    args = trl.DPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, logging_steps=1, max_length=32, **COMMON
    )
    model = tiny_llama(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = NanoDPO(
        model=model,
        ref_model=tiny_llama(tokenizer),  # the reference model, frozen (TRL would load one from the model's name)
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(pairs),
    )
    trainer.train()
    assert type(trainer.optimizer.optimizer) is MuonAdamW and len(_losses(trainer)) == 2
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert "model.layers.0.mlp.up_proj.weight" in moved and "model.embed_tokens.weight" in moved


def test_grpo_trainer(tokenizer, tmp_path):
    def reward_length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    prompts = [{"prompt": " ".join(WORDS[i : i + 3])} for i in range(4)]
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=6,
        logging_steps=1,
        **COMMON,
    )
    model = tiny_llama(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = NanoGRPO(
        model=model,
        reward_funcs=reward_length,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(prompts),
        nanochat_optimizer={"recipe": "2026-07"},
    )
    trainer.train()
    assert type(trainer.optimizer.optimizer) is NorMuonAdamW
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if "proj" in n)


def test_deepspeed_refused_in_one_line_saying_why_its_muon_is_not_nanochats():
    """What the Trainer reports once it has set DeepSpeed up (not installed in this CPU-only suite, so on a stand-in:
    FSDP1 and FSDP2 shardings are refused by a real Trainer in test_fsdp_trainer.py)."""
    from types import SimpleNamespace

    from nanochat_hf.integration import check_distributed_setup

    with pytest.raises(UserError, match="DeepSpeed is not supported") as e:
        check_distributed_setup(SimpleNamespace(is_deepspeed_enabled=True))
    assert "Keller Jordan's Muon + Adam rule, not nanochat's (Polar Express, NorMuon, cautious weight decay)" in str(
        e.value
    )
    assert "\n" not in str(e.value)


def test_unknown_optimizer_setting_is_one_line(tokenizer, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), **COMMON)
    with pytest.raises(UserError, match=r"nanochat_optimizer: unknown \['matrix_rate'\]; build_optimizer takes"):
        NanoTrainer(model=tiny_llama(tokenizer), args=args, nanochat_optimizer={"matrix_rate": 0.01})
    assert not (tmp_path / "out").exists()


def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"recipe": "2026-01"}, "optimizer setting recipe='2026-01' (str): expected one of '2025-12', '2026-07'"),
        ({"init_lr_frac": "0.1"}, "optimizer setting init_lr_frac='0.1' (str): expected a number > 0"),
        ({"betas": 0.9}, "optimizer setting betas=0.9 (float): expected two numbers in [0, 1)"),
        ({"matrix_lr": None}, "optimizer setting matrix_lr=None (NoneType): expected a number >= 0"),
        ({"recipe": "2026-07", "matrix_optimizer": "adamw"}, "the AdamW ablation exists in recipe '2025-12' only"),
        ({"roles": {"*.experts.*": "scalar"}}, "roles glob '*.experts.*' matches no trainable parameter"),
        (
            {"roles": {"model.layers.0.*": "scalar", "*.q_proj.weight": "matrix"}},
            "parameter 'model.layers.0.self_attn.q_proj.weight' matches roles",
        ),
        ({"roles": {"*.q_proj.weight": "muon"}}, "roles['*.q_proj.weight'] = 'muon': expected one of embedding"),
        ({"frozen": True}, "every parameter of the model is frozen"),
    ],
)
def test_every_setting_mistake_is_one_line_when_the_trainer_is_built(tokenizer, tmp_path, settings, message):
    """Each mistake stops the Trainer's construction (not train()) with one UserError line naming the setting;
    nothing is written."""
    settings = dict(settings)
    model = _frozen(tiny_llama(tokenizer)) if settings.pop("frozen", False) else tiny_llama(tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), **COMMON)
    with pytest.raises(UserError) as e:
        NanoTrainer(model=model, args=args, nanochat_optimizer=settings)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_resume_converts_renamed_weights_and_refuses_others(tokenizer, tmp_path):
    """transformers 5.24 saves GPT-NeoX's head as embed_out.weight, and its Trainer's resume, finding no
    lm_head.weight, would only warn and train on from a restarted head: the mixin reads such a checkpoint as
    from_pretrained does (the head is the saved one). A checkpoint whose weights do not fit even so (one layer
    fewer) stops before loading, in one line naming the keys, and the checkpoint is left as it was. A tied head
    saved once is not missing."""
    from safetensors.torch import load_file
    from transformers import GPTNeoXConfig

    from nanochat_hf.integration.mixin import renamed_weights

    def neox(layers=2):
        torch.manual_seed(0)
        config = GPTNeoXConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
            intermediate_size=64,
        )  # fmt: skip
        return AutoModelForCausalLM.from_config(config)

    ids = [tokenizer.encode(" ".join(WORDS[i : i + 8]))[:8] for i in range(8)]
    data = Dataset.from_list([{"input_ids": x, "labels": x} for x in ids])
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, save_steps=2, **COMMON
    )
    NanoTrainer(model=neox(), args=args, train_dataset=data).train()
    ckpt = tmp_path / "checkpoint-2"
    assert "embed_out.weight" in load_file(ckpt / "model.safetensors")  # the name the model has not
    resumed = NanoTrainer(model=neox(), args=args, train_dataset=data)
    resumed._load_from_checkpoint(str(ckpt))  # what train(resume_from_checkpoint=...) calls first
    saved = load_file(ckpt / "model.safetensors")
    assert torch.equal(resumed.model.lm_head.weight.detach(), saved["embed_out.weight"])
    before = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, save_steps=2, **COMMON
    )
    resumed = NanoTrainer(model=neox(layers=3), args=args, train_dataset=data)
    with pytest.raises(UserError) as e:
        resumed.train(resume_from_checkpoint=str(ckpt))
    msg = str(e.value)
    assert "missing ['gpt_neox.layers.2." in msg and "unexpected []" in msg and "\n" not in msg, msg
    assert resumed.state.global_step == 0 and not (tmp_path / "checkpoint-4").exists()
    assert {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()} == before
    tied = tiny_llama(tokenizer)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    tied.save_pretrained(tmp_path / "tied")
    assert renamed_weights(tied, str(tmp_path / "tied")) is None  # lm_head.weight is embed_tokens.weight: present


def test_resume_with_a_weight_shard_missing_is_refused(tokenizer, tmp_path):
    """A checkpoint whose weight index lists a shard file that is not there: one line naming the file."""
    from nanochat_hf.integration.mixin import renamed_weights

    model = tiny_llama(tokenizer)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    assert renamed_weights(model, str(tmp_path)) is None  # whole, under the model's names: the stock loader's
    shards[-1].unlink()
    with pytest.raises(UserError) as e:
        renamed_weights(model, str(tmp_path))
    assert str(e.value) == f"{shards[-1]}: missing (listed in {tmp_path}'s weight index): a partial checkpoint"
