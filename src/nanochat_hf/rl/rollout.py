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
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from ..inference import CalculatorToolProcessor, generate_tokens, stop_and_pad_ids
from ..tokenizer import render_for_completion
from ..tokenizer.chat_format import SPECIAL_TOKENS


def has_nanochat_format(tokenizer: Any) -> bool:
    """The tokenizer has all nine of nanochat's special tokens (then nanochat's rendering and calculator apply)."""
    vocab = tokenizer.get_vocab()
    return all(name in vocab for name in SPECIAL_TOKENS)


def render_prompt(tokenizer: Any, conversation: list[dict] | Mapping) -> list[int]:
    """Prompt ids: nanochat's `render_for_completion` where the tokenizer has nanochat's format, else the model's
    own chat template with the generation prompt."""
    if has_nanochat_format(tokenizer):
        return render_for_completion(tokenizer, conversation)
    messages = conversation["messages"] if isinstance(conversation, Mapping) else conversation
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def sampled_mask(completion: list[int], tool: CalculatorToolProcessor | None, stops: set[int]) -> list[int]:
    """nanochat's per-token mask of one completion: 0 for what the calculator forced (replaying its state machine:
    after ``<|python_start|>`` expr ``<|python_end|>``, the forced reply's tokens) and for a stop token, else 1."""
    mask: list[int] = []
    pending: list[int] = []  # forced tokens still expected
    expression: list[int] | None = None  # inside a python block: its tokens so far
    for token in completion:
        forced = bool(pending) and token == pending[0]
        pending = pending[1:] if forced else []
        mask.append(0 if forced or token in stops else 1)
        if tool is None:
            continue
        if token == tool.python_start:
            expression = []
        elif token == tool.python_end and expression is not None:
            pending = tool.forced_reply(expression) or []
            expression = None
        elif expression is not None:
            expression.append(token)
    return mask


class NanoChatRollout:
    """TRL's ``rollout_func(prompts, trainer)``: prompts arrive as TRL's sampler repeats them (each prompt's
    ``num_generations`` copies in a row); each run of ``device_batch_size`` copies is one pass of
    `generate_tokens` (temperature, top-k, at most ``max_new_tokens`` tokens, the calculator when ``calculator``).

    Each pass has its own seed, ``hash((step, row, pass)) & 0x7FFFFFFF`` as chat_rl.py's (``row``: the prompt's
    position in this process's batch, where nanochat uses its dataset index), so a resumed run samples what the
    uninterrupted one did. ``seconds`` adds up the wall time spent sampling (the step's sampling share).
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
        self.stops = set(stop_and_pad_ids(tokenizer, calculator)[0])
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

    def sample(self, model: Any, prompt: list[int], seed: int) -> list[list[int]]:
        """One pass: ``device_batch_size`` completions of `prompt` (each ends at its stop token, included)."""
        rows = [prompt] * self.device_batch_size
        return generate_tokens(
            model,
            self.tokenizer,
            rows,
            self.max_new_tokens,
            self.temperature,
            self.top_k,
            seed=seed,
            calculator=self.tool is not None,
        )

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        start = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        step, B = trainer.state.global_step, self.device_batch_size
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": []}
        for first in range(0, len(prompts), B):
            prompt = self.prompt_ids(prompts[first])
            seed = hash((step, first // trainer.num_generations, first % trainer.num_generations // B)) & 0x7FFFFFFF
            for completion in self.sample(model, prompt, seed):
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(completion)
                out["env_mask"].append(sampled_mask(completion, self.tool, self.stops))
        self.seconds += time.perf_counter() - start
        return out
