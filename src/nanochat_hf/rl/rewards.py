"""nanochat's GSM8K reward as a TRL reward function, the check every reward function's output goes through, and
pass@k."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UserError
from ..inference import decode_completion
from ..tasks.common import Problem
from ..tasks.gsm8k import TASK as GSM8K
from .rollout import has_nanochat_format

RewardFunc = Callable[..., list[float | None]]


def gsm8k_reward(tokenizer: Any) -> RewardFunc:
    """TRL reward function: 1.0 where the completion's final ``#### N`` equals the row's ``answer`` column, else
    0.0. The verdict is the GSM8K task's (`tasks.gsm8k.check_final_number`, nanochat's ``reward``), on the completion
    decoded as nanochat decodes it (tool blocks written out, the stop token left out; a model of another chat
    format: its text)."""

    nanochat = has_nanochat_format(tokenizer)

    def decode(ids: list[int]) -> str:  # another chat format: its text (its eos token is special, so dropped)
        return decode_completion(tokenizer, ids) if nanochat else tokenizer.decode(ids, skip_special_tokens=True)

    def gsm8k_correct(completion_ids: list[list[int]], answer: list[str | None], **_: Any) -> list[float]:
        return [
            float(GSM8K.check(Problem([], ref), decode(ids))) for ids, ref in zip(completion_ids, answer, strict=True)
        ]

    return gsm8k_correct


def checked_reward(func: RewardFunc) -> RewardFunc:
    """`func` whose output must be one float (or None: not applicable, as TRL allows) per completion; anything else
    is a one-line UserError naming the function, before TRL turns it into a tensor."""
    name = getattr(func, "__name__", type(func).__name__)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> list[float | None]:
        out = func(*args, **kwargs)
        expected = len(kwargs["completion_ids"])
        if not isinstance(out, Sequence) or isinstance(out, str) or len(out) != expected:
            got = f"{len(out)} values" if isinstance(out, Sequence) and not isinstance(out, str) else type(out).__name__
            raise UserError(
                f"reward function {name} returned {got}; expected a list of {expected} floats (one per completion)"
            )
        bad = next(
            (
                r
                for r in out
                if not (r is None or (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)))
            ),
            "ok",
        )
        if bad != "ok":
            raise UserError(
                f"reward function {name} returned {bad!r} ({type(bad).__name__}); expected finite floats or None"
            )
        return list(out)

    return wrapper


def pass_at_k(outcomes: list[list[bool]], k_max: int) -> list[float]:
    """chat_rl.py's pass@k for k = 1..k_max: the fraction of problems where any of the first k samples is correct."""
    return [sum(any(o[:k]) for o in outcomes) / len(outcomes) for k in range(1, k_max + 1)]
