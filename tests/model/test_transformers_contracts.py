"""The contracts transformers tests its own decoder models on (backbone, output fields, tuples, attention
implementations, save/load, generation with and without a mask), written for this model."""

from __future__ import annotations

import contextlib
import copy
import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from nanochat_hf import (
    NanoChatGPTConfig,
    NanoChatGPTForCausalLM,
    NanoChatGPTForSequenceClassification,
    NanoChatGPTModel,
)
from nanochat_hf.model.modeling_nanochat_gpt import CACHE, rotary_cos_sin

from .conftest import randomize

BOS = 0  # also the pad token, as with nanochat's tokenizer
EOS = 1


class NanoChatGPTModelTester:
    """Tiny configs and inputs for the tests below (the role of transformers' per-model *ModelTester)."""

    batch_size, seq_length = 3, 9
    config_kwargs = dict(
        sequence_len=64,
        vocab_size=99,
        n_layer=3,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=BOS,
    )

    def get_config(self, **overrides) -> NanoChatGPTConfig:
        return NanoChatGPTConfig(**{**self.config_kwargs, **overrides})

    def model(self, cls=NanoChatGPTForCausalLM, seed: int = 0, **overrides):
        return randomize(cls(self.get_config(**overrides)), seed).eval()

    def inputs(self, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids starting with <|bos|> as every nanochat sequence does; row 0 left-padded by 3."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, self.config_kwargs["vocab_size"], (self.batch_size, self.seq_length), generator=g)
        ids[:, 0] = BOS
        mask = torch.ones_like(ids)
        ids[0, :4], mask[0, :3] = BOS, 0  # three pads, then the row's own <|bos|>
        return ids, mask


tester = NanoChatGPTModelTester()


def test_backbone_is_mounted_as_transformer_with_nanochat_names():
    model = tester.model()
    assert NanoChatGPTForCausalLM.base_model_prefix == "transformer"
    assert model.base_model is model.transformer and isinstance(model.transformer, NanoChatGPTModel)
    assert model.get_input_embeddings() is model.transformer.wte
    assert {k for k in model.state_dict() if not k.startswith("transformer.h.")} == {
        "transformer.wte.weight",
        "lm_head.weight",
    }
    ids, mask = tester.inputs()
    with torch.no_grad():
        base = model.transformer(ids, attention_mask=mask)
        out = model(ids, attention_mask=mask)
    assert isinstance(base, BaseModelOutputWithPast) and isinstance(out, CausalLMOutputWithPast)
    assert base.last_hidden_state.shape == (tester.batch_size, tester.seq_length, 32)
    cap = model.config.final_logit_softcapping
    expected = cap * torch.tanh(model.lm_head(base.last_hidden_state).float() / cap)
    assert torch.equal(out.logits, expected)
    assert out.hidden_states is None and out.attentions is None  # only on request


@pytest.mark.parametrize("via", ["kwarg", "config"])
def test_hidden_states(via):
    model = tester.model()
    ids, mask = tester.inputs()
    if via == "config":
        model.config.output_hidden_states = True
    kw = {"output_hidden_states": True} if via == "kwarg" else {}
    with torch.no_grad():
        out = model(ids, attention_mask=mask, **kw)
        base = model.transformer(ids, attention_mask=mask, **kw)
    hs = out.hidden_states
    assert len(hs) == model.config.n_layer + 1 == len(base.hidden_states)
    assert all(h.shape == (tester.batch_size, tester.seq_length, 32) for h in hs)
    # first: the embedding after nanochat's post-embedding norm; last: after the final norm (= last_hidden_state)
    embedded = model.transformer.wte(ids)
    assert torch.allclose(hs[0], F.rms_norm(embedded, (32,)), atol=1e-6)
    assert torch.equal(hs[-1], base.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(hs, base.hidden_states))
    # the middle ones are the blocks' outputs, as a manual walk through the blocks gives (rows without padding)
    x = hs[0][1:]
    cos_sin = rotary_cos_sin(model.config, torch.arange(tester.seq_length).expand(2, -1))
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h[:-1]):
            x = block(x, cos_sin)
            assert torch.allclose(hs[i + 1][1:], x, atol=1e-5), i
            assert not torch.allclose(hs[i + 1], hs[i])


def test_attentions_eager_and_sdpa():
    model = tester.model()
    model.set_attn_implementation("eager")
    ids, mask = tester.inputs()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True)
    att = out.attentions
    assert len(att) == model.config.n_layer
    assert all(a.shape == (tester.batch_size, 4, tester.seq_length, tester.seq_length) for a in att)
    assert torch.allclose(att[0].sum(-1), torch.ones(()), atol=1e-5)  # softmax rows
    assert (att[1][1:].triu(1) == 0).all()  # causal (rows without padding)
    assert (att[2][0, :, 3:, :3] == 0).all()  # row 0's real tokens do not attend to its left padding
    # sdpa computes no weights: transformers warns and none are returned (use eager for them)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        sdpa = model(ids, attention_mask=mask, output_attentions=True)
    assert sdpa.attentions == ()
    assert (sdpa.logits[:, 3:] - out.logits[:, 3:]).abs().max().item() < 1e-5


def test_return_dict_false_gives_tuples():
    model = tester.model()
    ids, mask = tester.inputs()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, labels=ids, output_hidden_states=True)
        loss, logits, hidden = model(ids, attention_mask=mask, labels=ids, output_hidden_states=True, return_dict=False)
        (last,) = model.transformer(ids, attention_mask=mask, use_cache=False, return_dict=False)
        model.config.return_dict = False
        from_config = model(ids, attention_mask=mask)
    assert torch.equal(loss, ref.loss) and torch.equal(logits, ref.logits) and len(hidden) == 4
    assert torch.equal(last, ref.hidden_states[-1])
    assert isinstance(from_config, tuple) and torch.equal(from_config[0], ref.logits)


def test_save_load_round_trip_and_backbone_from_a_causal_lm_dir(tmp_path):
    model = tester.model()
    ids, mask = tester.inputs()
    model.save_pretrained(tmp_path)
    loaded = NanoChatGPTForCausalLM.from_pretrained(tmp_path).eval()
    backbone = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
        assert torch.equal(
            backbone(ids, attention_mask=mask).last_hidden_state,
            model.transformer(ids, attention_mask=mask).last_hidden_state,
        )


def test_generate_without_mask_equals_with_mask():
    model = tester.model()
    prompt = torch.tensor([[BOS, 5, 17, 42, 7]])
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        with_mask = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
        without = model.generate(prompt, **kw)
        # what transformers would infer for pad == bos (the leading <|bos|> masked) changes the output
        masked_bos = model.generate(prompt, attention_mask=(prompt != BOS).long(), **kw)
    assert torch.equal(without, with_mask)
    assert not torch.equal(masked_bos, with_mask)


def test_batched_left_padded_equals_one_by_one_with_pad_equal_to_bos():
    model = tester.model()
    prompts = [[BOS, 5, 6, 7, 8, 9, 10], [BOS, 12], [BOS, 14, 15, 16]]
    kw = dict(max_new_tokens=6, do_sample=False, eos_token_id=None)
    width = max(map(len, prompts))
    ids = torch.tensor([[BOS] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        singles = [model.generate(torch.tensor([p]), **kw)[0, len(p) :].tolist() for p in prompts]
        batched = model.generate(ids, attention_mask=mask, **kw)[:, width:].tolist()
        inferred = model.generate(ids, **kw)[:, width:].tolist()  # the mask inferred from the leading pads
    assert batched == singles
    assert inferred == singles


def test_static_cache_generation_equals_dynamic():
    model = tester.model()
    prompt = torch.tensor([[BOS, 5, 17, 42, 7], [BOS, BOS, BOS, 3, 4]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        dynamic = model.generate(prompt, **kw)
        static = model.generate(prompt, cache_implementation="static", **kw)
    assert torch.equal(static, dynamic)


def test_sequence_classification_reads_the_last_real_token():
    model = tester.model(NanoChatGPTForSequenceClassification, num_labels=3)
    ids, mask = tester.inputs()
    ids[2, -2:], mask[2, -2:] = BOS, 0  # row 2 right-padded: its last real token is at -3
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        out = model(ids, attention_mask=mask, labels=labels)
        hidden = model.transformer(ids, attention_mask=mask).last_hidden_state
        alone = model(ids[0:1, 3:]).logits  # row 0 without its left padding, no mask
    assert out.logits.shape == (3, 3)
    expected = model.score(hidden[[0, 1, 2], [-1, -1, -3]])
    assert torch.allclose(out.logits, expected, atol=1e-6)
    assert torch.allclose(out.loss, F.cross_entropy(expected, labels), atol=1e-6)
    assert (alone - out.logits[0:1]).abs().max().item() < 1e-5


def test_inputs_embeds_and_resize_token_embeddings():
    model = tester.model()
    ids, mask = tester.inputs()
    with torch.no_grad():
        from_ids = model(ids, attention_mask=mask).logits
        from_embeds = model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask).logits
    assert torch.equal(from_ids, from_embeds)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(ids, inputs_embeds=model.get_input_embeddings()(ids))
    model.resize_token_embeddings(120)
    assert model.transformer.wte.weight.shape == (120, 32) and model.lm_head.weight.shape == (120, 32)
    assert model.config.vocab_size == 120
    with torch.no_grad():
        assert model(ids).logits.shape == (tester.batch_size, tester.seq_length, 120)


def test_loss_honours_shift_labels():
    """Sequence/context parallel training shifts the labels on the whole sequence before sharding it and hands the
    model ``shift_labels`` (transformers' test_causal_lm_loss_honors_shift_labels): they replace ``labels``, and a
    shard's last position is scored against the target they give it. On a model with a non-zero head: a fresh one
    has nanochat's zero ``lm_head``, every logit 0 and so the same loss for any target (which is why transformers'
    test, run on a fresh model, cannot tell its targets apart: docs/hub.md)."""
    ids, mask = tester.inputs()
    with torch.no_grad():
        assert not NanoChatGPTForCausalLM(tester.get_config())(ids).logits.any()
    model = tester.model()
    labels = ids.clone()
    labels[0, :4] = -100  # the left padding and its <|bos|>
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]  # what the Trainer builds before sharding
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, labels=labels)
        given = model(ids, attention_mask=mask, shift_labels=shifted)
        other_labels = model(ids, attention_mask=mask, labels=torch.zeros_like(labels), shift_labels=shifted)
        shard_end = shifted.clone()
        shard_end[:, -1] = 5  # a shard's last token has the next shard's first token as its target
        per_token = model(ids, attention_mask=mask, shift_labels=shard_end, loss_reduction="none").loss
    assert torch.allclose(given.loss, ref.loss, atol=1e-6, rtol=0)
    assert torch.equal(other_labels.loss, given.loss)  # labels are ignored once shift_labels are given
    expected = F.cross_entropy(ref.logits.transpose(1, 2), shard_end, ignore_index=-100, reduction="none")
    assert per_token.shape == shard_end.shape and torch.equal(per_token, expected) and (per_token[:, -1] > 0).all()
    with pytest.raises(ValueError, match=r"shift_labels shape \(3, 8\) != logits shape \(3, 9\)"):
        model(ids, shift_labels=shifted[:, 1:])


def overfit(model: NanoChatGPTForCausalLM, steps: int = 300) -> tuple[list[float], list[float], dict]:
    """transformers' test_training_overfit loop: Adam (lr 1e-3), gradients clipped at norm 1, one fixed batch of two
    rows of 64 tokens counting 1..19 over and over. Returns the losses, the gradient norms (before clipping) and the
    first step's gradient norm of each parameter."""
    ids = torch.tensor([(list(range(1, 20)) * 4)[:64]] * 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, norms, first = [], [], {}
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        first = first or {name: p.grad.norm().item() for name, p in model.named_parameters()}
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0).item())
        losses.append(loss.item())
        optimizer.step()
    return losses, norms, first


@pytest.mark.slow
def test_overfit_gradient_norm_falls_less_only_because_the_head_starts_at_zero():
    """transformers' test_training_overfit wants the loss and the gradient norm 90% below their first step's. With
    nanochat's init the LM head starts at zero, so no gradient reaches the body on the first step: that step's norm,
    the test's reference, is the head's alone, and the norm falls 89.6% where the loss falls 97%. The same model
    with a small random head (Llama's N(0, 0.02)) clears both (numbers: docs/hub.md)."""
    config = NanoChatGPTConfig(vocab_size=99, n_embd=32, n_layer=2, n_head=2, sequence_len=512)  # transformers' tester
    torch.manual_seed(42)
    fresh = NanoChatGPTForCausalLM(config)
    random_head = copy.deepcopy(fresh)
    with torch.no_grad():
        random_head.lm_head.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
    runs = {"fresh": overfit(fresh), "random head": overfit(random_head)}
    losses, norms, first = runs["fresh"]
    assert {name for name, norm in first.items() if norm > 0} == {"lm_head.weight"}
    assert norms[0] == pytest.approx(first["lm_head.weight"], rel=1e-6)
    reduction = {run: (1 - loss[-1] / loss[0], 1 - norm[-1] / norm[0]) for run, (loss, norm, _) in runs.items()}
    assert reduction["fresh"][0] > 0.95 and reduction["random head"][0] > 0.95  # the loss, either way
    assert reduction["fresh"][1] < 0.9 <= reduction["random head"][1]  # the gradient norm: the reference decides


def test_stock_trainer_evaluate_reports_eval_loss(tmp_path):
    """A plain ``Trainer(model=...).evaluate()`` returns ``eval_loss``: the Trainer scores a batch only when every
    label name of the forward (``transformers.utils.find_labels``) is in it, so the forward names ``labels`` only
    (``shift_labels`` goes through ``**kwargs``). The loss is the model's own mean over the eval rows."""
    from transformers import Trainer, TrainingArguments
    from transformers.utils import find_labels

    assert find_labels(NanoChatGPTForCausalLM) == ["labels"]
    model = tester.model()
    ids, _ = tester.inputs()
    rows = [{"input_ids": row, "labels": row} for row in ids[1:]]  # the two unpadded rows, one batch
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    metrics = Trainer(model=model, args=args, eval_dataset=rows).evaluate()
    with torch.no_grad():
        expected = model(ids[1:], labels=ids[1:]).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-6)


def test_assisted_decoding_equals_greedy():
    """``generate(..., assistant_model=...)`` works (transformers 5.24 hands the model its cache as ``cache`` and
    checks that the forward names it) and gives plain greedy decoding's tokens."""
    model, assistant = tester.model(), tester.model(seed=7)
    ids, _ = tester.inputs()
    kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        plain = model.generate(ids[1:2], **kw)
        assisted = model.generate(ids[1:2], assistant_model=assistant, **kw)
    assert torch.equal(assisted, plain)


@pytest.mark.parametrize("cls", [NanoChatGPTModel, NanoChatGPTForCausalLM, NanoChatGPTForSequenceClassification])
def test_old_cache_keyword_works_with_a_deprecation_warning(cls):
    """transformers 5.24 renamed the KV cache argument ``past_key_values`` to ``cache``; as its own models do
    (transformers' test_bc_cache_name_forward), every forward takes the old name with a FutureWarning and fills the
    same cache, prefill and then a one-token step. (Before 5.24 generate() itself passes the old name: no warning.)"""
    model = tester.model(cls)
    ids, mask = tester.inputs()

    def prefill_and_step(name: str) -> tuple:
        cache = DynamicCache(config=model.config)
        first = model(ids, attention_mask=mask, use_cache=True, **{name: cache})
        step = model(ids[:, -1:], use_cache=True, **{name: cache})  # no mask: the same inputs under both names
        assert getattr(first, CACHE) is cache and cache.get_seq_length() == tester.seq_length + 1
        return first[0], step[0]

    old_name_warns = pytest.warns(FutureWarning, match=r"`past_key_values` is deprecated .* Use `cache` instead")
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the new name: no warning
            new = prefill_and_step("cache")
        with old_name_warns if CACHE == "cache" else contextlib.nullcontext():
            old = prefill_and_step("past_key_values")
    assert all(torch.equal(a, b) for a, b in zip(new, old))


def test_trained_model_config_keeps_use_cache(tmp_path):
    """transformers' Trainer writes args.use_cache into the model's config (its default, False, would make every
    generate() of the saved model run without a KV cache): ours says True."""
    from transformers import Trainer

    from nanochat_hf.training.arguments import MidTrainingArguments

    model = tester.model()
    Trainer(model=model, args=MidTrainingArguments(output_dir=str(tmp_path), eval_strategy="no"))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["use_cache"] is True


def test_demo_tokenizer_saved_alone_knows_the_model_context(tmp_path):
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.data.demo import DEMO_SEQUENCE_LEN

    demo_tokenizer().save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == DEMO_SEQUENCE_LEN == 1024


G5_FEATURES = dict(residual_lambdas=True, value_embeddings=True, ve_gate_channels=12, smear=True, backout=True)
BLOCK_MATRICES = {"c_q", "c_k", "c_v", "c_proj", "c_fc"}


@pytest.mark.parametrize(
    "features, all_linear",
    [({}, BLOCK_MATRICES), (G5_FEATURES, BLOCK_MATRICES | {"ve_gate", "smear_gate"})],
    ids=["g0", "g5"],
)
def test_lora_with_all_linear_or_the_block_matrices(features, all_linear):
    """PEFT keeps default LoRA targets only for the model types in its own table: ``LoraConfig()`` alone stops with
    one line naming the field. ``target_modules="all-linear"`` (docs/hub.md) takes every linear layer but the LM
    head: the block matrices, and from G3 on the small gates too; the block matrices alone go by name. Either
    way the adapted model starts as the base model and its adapters train."""
    peft = pytest.importorskip("peft")
    ids, mask = tester.inputs()
    with pytest.raises(ValueError, match="Please specify `target_modules`"):
        peft.get_peft_model(tester.model(**features), peft.LoraConfig(r=2))
    for targets, expected in (("all-linear", all_linear), (sorted(BLOCK_MATRICES), BLOCK_MATRICES)):
        base = tester.model(**features)
        with torch.no_grad():
            before = base(ids, attention_mask=mask).logits
        lora = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=targets))
        names = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in lora.named_parameters() if "lora_A" in n}
        assert names == expected, targets
        assert torch.allclose(lora(ids, attention_mask=mask).logits, before, atol=1e-5)  # adapters start at 0
        lora(ids, attention_mask=mask, labels=ids).loss.backward()
        trained = {n for n, p in lora.named_parameters() if p.grad is not None and p.grad.any()}
        assert trained and all("lora_" in n for n in trained)
