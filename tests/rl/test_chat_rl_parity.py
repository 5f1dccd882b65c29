"""Our RL stage against nanochat HEAD's scripts/chat_rl.py executing (data/, made by data/make_rl_reference.py): a
tiny G5 model from HEAD's base_train + chat_sft, 5 steps of chat_rl.py (2 prompts x 8 samples per step, passes of
4, the calculator forcing tokens in). HEAD's sampled sequences are fed to our trainer (its rollout replays them);
on them: the prompts (row order), the masks token for token, rewards, advantages, every pass's loss, every gradient
before each update whose advantages are not all 0, the weights after the 5 updates, and pass@k on HEAD's
evaluation samples."""

import copy
import json

import pyarrow.parquet as pq
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import TrainerCallback

from nanochat_hf.conversion.generations import hf_names
from nanochat_hf.rl.arguments import parse_args
from nanochat_hf.rl.rewards import gsm8k_reward, pass_at_k
from nanochat_hf.rl.rollout import NanoChatRollout, sampled_mask
from nanochat_hf.rl.run import build_trainer, load_model

from .conftest import DATA, tiny_args

REF = json.loads((DATA / "rl_reference.json").read_text())
FLAGS = dict(zip(REF["chat_rl_flags"][::2], REF["chat_rl_flags"][1::2]))
B, N, MAX_NEW = int(FLAGS["--device-batch-size"]), int(FLAGS["--num-samples"]), int(FLAGS["--max-new-tokens"])


def prefix_len(example: dict) -> int:
    """HEAD's prompt length: targets are -1 up to the last prompt token (the first completion token is sampled)."""
    return next(i for i, t in enumerate(example["targets"][0]) if t != -1) + 1


def head_mask(example: dict, row: int) -> list[int]:
    """HEAD's mask of one sample's completion tokens, read from its targets (-1 = mask 0)."""
    p, n = prefix_len(example), len(example["sequences"][row])
    return [int(t != -1) for t in example["targets"][row][p - 1 : n - 1]]


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    args = parse_args(tiny_args(tmp_path_factory.mktemp("rl")))
    return load_model(args)


def head_completions(example: dict, stop: int) -> list[list[int]]:
    """HEAD's completions with the stop token generate_batch dropped put back (a sample under MAX_NEW tokens
    stopped; the stop token carries no gradient and no reward either way)."""
    p = prefix_len(example)
    return [s[p:] + ([stop] if len(s) - p < MAX_NEW else []) for s in example["sequences"]]


def test_prompts_masks_rewards_and_pass_at_k_equal_head(model_and_tokenizer):
    _, tok = model_and_tokenizer
    rollout = NanoChatRollout(tok, B, MAX_NEW, 1.0, 50, calculator=True, max_sequence_len=256)
    stop = tok.convert_tokens_to_ids("<|assistant_end|>")

    def shuffled(name: str) -> Dataset:  # nanochat's GSM8K order
        return Dataset.from_list(pq.read_table(DATA / name).to_pylist()).shuffle(seed=42)

    def answer(row: dict) -> str:
        return row["answer"].rsplit("#### ", 1)[1]

    reward, train, forced = gsm8k_reward(tok), shuffled("gsm8k_train.parquet"), 0
    for i, example in enumerate(REF["examples"]):
        completions = head_completions(example, stop)
        assert reward(completion_ids=completions, answer=[answer(train[i])] * N) == example["rewards"]
        for row, completion in enumerate(completions):
            ours = sampled_mask(completion, rollout.tool, rollout.stops)
            n = len(example["sequences"][row]) - prefix_len(example)
            assert ours[:n] == head_mask(example, row)
            assert ours[n:] in ([], [0])  # the stop token: no gradient
            forced += n - sum(ours[:n])
    assert forced > 0  # the calculator forced tokens in (the masks are not all ones)
    test = shuffled("gsm8k_test.parquet")
    [evaluation] = REF["eval"]
    outcomes = []
    for record in evaluation["records"]:
        scores = reward(completion_ids=record["samples"], answer=[answer(test[record["idx"]])] * B)
        assert scores == [float(o["is_correct"]) for o in record["outcomes"]]
        outcomes.append([s == 1.0 for s in scores])
    assert pass_at_k(outcomes, B) == pytest.approx(evaluation["passk"], abs=1e-7)


def test_training_on_head_rollouts_equals_chat_rl(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    model = copy.deepcopy(model).float()  # trained in place: the other tests keep HEAD's start weights
    stop = tok.convert_tokens_to_ids("<|assistant_end|>")
    examples = [(e["sequences"][0][: prefix_len(e)], head_completions(e, stop)) for e in REF["examples"]]

    class Replay(NanoChatRollout):
        def sample(self, model, prompt, seeds):
            head_prompt, completions = examples.pop(0)
            assert prompt == head_prompt  # the same GSM8K row, rendered the same
            assert len(seeds) * B == len(completions)
            return completions

    args = parse_args(tiny_args(tmp_path / "out"))
    trainer = build_trainer(args, model, tok)
    trainer.rollout.__class__ = Replay
    names = {ours: theirs for theirs, ours in hf_names(model.config).items()}
    seen = {"advantages": [], "losses": [], "scales": [], "grads": {}}

    original = trainer._generate_and_score_completions

    def record(batch):
        out = original(batch)
        seen["advantages"] += out["advantages"].tolist()
        return out

    trainer._generate_and_score_completions = record
    compute_loss = trainer.compute_loss

    def loss(model, inputs, **k):
        value = compute_loss(model, inputs, **k)
        seen["losses"].append(value.item())
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        weight = (inputs["advantages"].abs()[:, None] * mask).sum() / mask.sum().clamp(min=1)
        seen["scales"].append(weight.item() / trainer.current_gradient_accumulation_steps)
        return value

    trainer.compute_loss = loss

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            seen["grads"][state.global_step] = {
                names[n]: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
            }

    trainer.add_callback(Grads())
    trainer.train()
    assert not examples
    assert seen["advantages"] == pytest.approx([a for e in REF["examples"] for a in e["advantages"]], abs=1e-7)
    # Our forward and nanochat's agree per token to float32 round-off in absolute terms (token NLLs within 1e-5
    # nats, measured): a confident token's NLL is itself a difference of two logits' size (logsumexp - logit), so
    # a pass of such tokens has no relative precision. The loss is compared in nats: within 1e-5 per token, per
    # unit of advantage (the scale: mean |A| over the valid tokens, divided as the loss is).
    for i, (ours, head, scale) in enumerate(zip(seen["losses"], REF["losses"], seen["scales"], strict=True)):
        assert abs(ours - head) <= 1e-5 * scale, i
    for step in (1, 2, 3):
        head = load_file(DATA / f"rl_grads_{step}.safetensors")
        ours = seen["grads"][step]
        assert sorted(ours) == sorted(head)
        # step 1 runs on HEAD's weights but for step 0's update (advantages all 0: weight decay only); steps 2 and 3
        # start from weights 1e-7 apart (the round-off of two optimizers), which sums over tokens of both signs amplify
        tolerance = 1e-5 if step <= 1 else 3e-5
        for name, grad in head.items():
            assert (ours[name] - grad).norm() <= tolerance * grad.norm() + 1e-12, (step, name)
    final = load_file(DATA / "rl_final.safetensors")
    state = model.state_dict()
    for theirs, ours in hf_names(model.config).items():
        ref = final[theirs]
        assert (state[ours].float() - ref).norm() <= 1e-5 * ref.norm(), theirs


def test_sampling_is_seed_equal_to_head(model_and_tokenizer):
    """On HEAD's weights (step 0) and with chat_rl.py's seeds, our sampler draws HEAD's step-0 rollouts token for
    token (forced calculator tokens included), and with the evaluation's seed 42 its evaluation samples."""
    model, tok = model_and_tokenizer
    model = model.float()
    rollout = NanoChatRollout(tok, B, MAX_NEW, 1.0, 50, calculator=True, max_sequence_len=256)
    stop = tok.convert_tokens_to_ids("<|assistant_end|>")
    for index, example in enumerate(e for e in REF["examples"] if e["step"] == 0):
        prompt = example["sequences"][0][: prefix_len(example)]
        seeds = [hash((0, index, p)) & 0x7FFFFFFF for p in range(N // B)]
        assert rollout.sample(model, prompt, seeds) == head_completions(example, stop)
    test = Dataset.from_list(pq.read_table(DATA / "gsm8k_test.parquet").to_pylist()).shuffle(seed=42)
    evaluation = NanoChatRollout(tok, B, 256 - 64, 1.0, 50, calculator=True, max_sequence_len=256)
    for record in REF["eval"][0]["records"][:2]:
        prompt = evaluation.prompt_ids([{"role": "user", "content": test[record["idx"]]["question"]}])
        ours = evaluation.sample(model, prompt, [42])
        assert [c[:-1] if c[-1] == stop else c for c in ours] == record["samples"]


def test_the_evaluation_samples_as_chat_rl_whatever_the_training_sampling(
    model_and_tokenizer, tmp_path, capsys, request
):
    """chat_rl.py's pass@k evaluation samples with run_gsm8k_eval's own settings (temperature 1.0, top-k 50, 256
    tokens, seed 42), not the training flags: with training sampling set to greedy, 8 tokens, the callback of
    the script's trainer gives HEAD's pass@k on HEAD's weights, and says how far it is as it goes."""
    from nanochat_hf.rl.trainer import PassAtKCallback

    model, tok = model_and_tokenizer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on a loaded machine spin-wait: 20x slower sampling here
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    flags = {"eval_every": "1", "eval_examples": "8", "temperature": "0", "top_k": "1", "max_new_tokens": "8"}
    trainer = build_trainer(parse_args(tiny_args(tmp_path / "out", **flags)), model.float(), tok)
    [callback] = [c for c in trainer.callback_handler.callbacks if isinstance(c, PassAtKCallback)]
    [evaluation] = REF["eval"]
    assert list(callback.evaluate(0).values()) == pytest.approx(evaluation["passk"], abs=1e-7)
    assert "chat_rl pass@k at step 0: 8 problems\n" in capsys.readouterr().err  # before the first is sampled
