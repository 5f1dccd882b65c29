"""Rollouts as nanochat's chat_rl.py samples them, as TRL's ``rollout_func``: each prompt's samples in passes of
``device_batch_size`` rows, the calculator running inside sampling, and an ``env_mask`` (TRL's name for "the model
wrote this token") that is 0 where nanochat's ``Engine.generate_batch`` returns mask 0.

nanochat's mask: 1 for a sampled token; 0 for the tokens the calculator forced in (``<|output_start|>`` result
``<|output_end|>``); the terminal ``<|assistant_end|>`` / ``<|bos|>`` is dropped from the sequence and chat_rl.py pads
with mask 0, so it gets no gradient either. TRL keeps the stop token in ``completion_ids`` (its logs count finished
completions by it): here it stays, with env_mask 0.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..errors import UserError
from ..inference import CalculatorToolProcessor
from ..tokenizer import render_for_completion
from ..tokenizer.chat_format import SPECIAL_TOKENS, STOP_TOKENS


def has_nanochat_format(tokenizer: Any) -> bool:
    """The tokenizer has all nine of nanochat's special tokens (then nanochat's rendering and calculator apply)."""
    vocab = tokenizer.get_vocab()
    return all(name in vocab for name in SPECIAL_TOKENS)


def check_prompt_format(tokenizer: Any, source: str) -> None:
    """UserError in one line, naming the model (`source`), when `render_prompt` cannot render a prompt: the
    tokenizer has neither nanochat's special tokens nor a chat template."""
    if not has_nanochat_format(tokenizer) and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"model_source={source}: its tokenizer has no chat template (chat_template in tokenizer_config.json, or "
            "chat_template.jinja) and not nanochat's special tokens; chat_rl renders each GSM8K problem as a chat "
            "prompt with one of them"
        )


def render_prompt(tokenizer: Any, conversation: list[dict] | Mapping) -> list[int]:
    """Prompt ids: nanochat's `render_for_completion` where the tokenizer has nanochat's format, else the model's
    own chat template with the generation prompt."""
    if has_nanochat_format(tokenizer):
        return render_for_completion(tokenizer, conversation)
    messages = conversation["messages"] if isinstance(conversation, Mapping) else conversation
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


class ToolState:
    """One row's calculator, as nanochat's Engine runs it: after ``<|python_start|>`` expr ``<|python_end|>``, the
    tool's reply (`CalculatorToolProcessor.forced_reply`) is forced in, one token per step. ``tool`` None: no tool."""

    def __init__(self, tool: CalculatorToolProcessor | None) -> None:
        self.tool = tool
        self.pending: deque[int] = deque()  # forced tokens still to come
        self.expression: list[int] | None = None  # inside a python block: its tokens so far

    def forced(self) -> int | None:
        """The token the tool forces next, or None (the model samples)."""
        return self.pending[0] if self.pending else None

    def feed(self, token: int) -> None:
        """The row's next token (forced or sampled)."""
        if self.pending and token == self.pending[0]:
            self.pending.popleft()
        else:
            self.pending.clear()
        if self.tool is None:
            return
        if token == self.tool.python_start:
            self.expression = []
        elif token == self.tool.python_end and self.expression is not None:
            self.pending = deque(self.tool.forced_reply(self.expression) or [])
            self.expression = None
        elif self.expression is not None:
            self.expression.append(token)


def sampled_mask(completion: list[int], tool: CalculatorToolProcessor | None, stops: set[int]) -> list[int]:
    """nanochat's per-token mask of one completion: 0 for what the calculator forced and for a stop token, else 1."""
    state, mask = ToolState(tool), []
    for token in completion:
        mask.append(0 if token == state.forced() or token in stops else 1)
        state.feed(token)
    return mask


def sample_next_token(
    logits: torch.Tensor, rngs: list[torch.Generator], temperature: float, top_k: int | None
) -> list[int]:
    """nanochat's engine.sample_next_token, for passes stacked in one batch: argmax at temperature 0, else top-k,
    softmax and one multinomial call per pass (its rows) from that pass's generator: the draws nanochat's
    separate passes make from the same seeds."""
    if temperature == 0.0:
        return logits.argmax(dim=-1).tolist()
    indices = None
    if top_k:
        logits, indices = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1)
    probs = F.softmax(logits / temperature, dim=-1)
    choice = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs.chunk(len(rngs)), rngs)])
    return (choice if indices is None else indices.gather(1, choice))[:, 0].tolist()


@torch.inference_mode()
def engine_sample(
    model: Any,
    prompt: list[int],
    seeds: list[int],
    rows_per_seed: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    tool: CalculatorToolProcessor | None,
    stops: set[int],
) -> list[list[int]]:
    """nanochat's Engine.generate_batch on our model, for ``len(seeds)`` passes of `rows_per_seed` rows at once:
    one prefill of the prompt, its KV cache repeated for every row, then one token per row per step (forced by the
    tool where it has one, else drawn as `sample_next_token` draws, each pass from a generator seeded with its
    seed), the rows in lockstep until all have stopped or `max_new_tokens` steps. Each completion ends at its first
    stop token (included). One batch for all of a prompt's passes and no per-step processors or stopping criteria:
    faster than generate() and than nanochat's passes one by one (benchmarks/rl_rollout.py)."""
    device = next(model.parameters()).device
    rngs = [torch.Generator(device=device) for _ in seeds]
    for rng, seed in zip(rngs, seeds):
        rng.manual_seed(seed)
    n = len(seeds) * rows_per_seed
    was_training = model.training
    model.eval()
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt], device=device)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    logits = logits.float().expand(n, -1)
    cache.batch_repeat_interleave(n)
    rows: list[list[int]] = [[] for _ in range(n)]
    states = [ToolState(tool) for _ in range(n)]
    done = [False] * n
    previous = torch.full((n,), prompt[-1], device=device)  # smear (G5) mixes in the token before the new one
    smear = {"previous_input_ids": previous} if getattr(model.config, "smear", False) else {}
    for _ in range(max_new_tokens):
        sampled = sample_next_token(logits, rngs, temperature, top_k)
        column = []
        for i, state in enumerate(states):
            token = state.forced()
            token = sampled[i] if token is None else token
            state.feed(token)
            column.append(token)
            if not done[i]:
                rows[i].append(token)
                done[i] = token in stops
        if all(done):
            break
        ids = torch.tensor(column, device=device)[:, None]
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **smear)
        logits = out.logits[:, -1].float()
        if smear:
            smear["previous_input_ids"] = ids[:, 0]
    model.train(was_training)
    return rows


class NanoChatRollout:
    """TRL's ``rollout_func(prompts, trainer)``: prompts arrive as TRL's sampler repeats them (each prompt's
    ``num_generations`` copies in a row), sampled in passes of ``device_batch_size`` (temperature, top-k, at most
    ``max_new_tokens`` tokens, the calculator when ``calculator``), a prompt's passes in one `engine_sample` batch.

    Each pass has chat_rl.py's seed, ``hash((step, index, pass)) & 0x7FFFFFFF`` with ``index`` the prompt's row in
    the train split (nanochat's ``example_idx`` with one process; with several, TRL splits a step's prompts into
    contiguous blocks where nanochat strides), so the samples are nanochat's from the same weights and a resumed
    run samples what the uninterrupted one did. ``seconds`` adds up the wall time spent sampling (the step's
    sampling share).
    """

    def __init__(
        self,
        tokenizer: Any,
        device_batch_size: int,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        calculator: bool,
        max_sequence_len: int,
    ) -> None:
        if calculator and not has_nanochat_format(tokenizer):
            missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
            raise UserError(
                f"calculator=true needs nanochat's calculator tokens; this tokenizer lacks {', '.join(missing)}: "
                "set calculator false for this model"
            )
        self.tokenizer = tokenizer
        self.device_batch_size, self.max_new_tokens = device_batch_size, max_new_tokens
        self.temperature, self.top_k = temperature, top_k
        self.tool = CalculatorToolProcessor(tokenizer) if calculator else None
        self.max_sequence_len = max_sequence_len
        vocab = tokenizer.get_vocab()  # nanochat's two stop tokens, else the model's eos
        self.stops = {vocab[t] for t in STOP_TOKENS} if has_nanochat_format(tokenizer) else {tokenizer.eos_token_id}
        self.seconds = 0.0
        self.__name__ = type(self).__name__  # TRL's profiling names a rollout_func by its __name__

    def prompt_ids(self, conversation: Any) -> list[int]:
        """The prompt's ids; a prompt that leaves no room for ``max_new_tokens`` in the model's context: UserError."""
        ids = render_prompt(self.tokenizer, conversation)
        if len(ids) + self.max_new_tokens > self.max_sequence_len:
            raise UserError(
                f"a prompt of {len(ids)} tokens + max_new_tokens={self.max_new_tokens} exceeds the model's context "
                f"({self.max_sequence_len} tokens); lower max_new_tokens or drop the longer prompts"
            )
        return ids

    def sample(self, model: Any, prompt: list[int], seeds: list[int]) -> list[list[int]]:
        """``len(seeds)`` passes of ``device_batch_size`` completions of `prompt`, each pass from its seed, in one
        batch (each completion ends at its stop token, included)."""
        return engine_sample(
            model,
            prompt,
            seeds,
            self.device_batch_size,
            self.max_new_tokens,
            self.temperature,
            self.top_k,
            self.tool,
            self.stops,
        )

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        start = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        group, step = trainer.num_generations, trainer.state.global_step
        local = len(prompts) // group  # this process's prompts (TRL gives each process a contiguous block)
        first_index = step * local * trainer.accelerator.num_processes + trainer.accelerator.process_index * local
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": []}
        for j in range(local):
            prompt = self.prompt_ids(prompts[j * group])
            index = (first_index + j) % len(trainer.train_dataset)  # the row, counted as nanochat cycles
            seeds = [hash((step, index, p)) & 0x7FFFFFFF for p in range(group // self.device_batch_size)]
            for completion in self.sample(model, prompt, seeds):
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(completion)
                out["env_mask"].append(sampled_mask(completion, self.tool, self.stops))
        self.seconds += time.perf_counter() - start
        return out
