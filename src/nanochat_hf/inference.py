"""Chat inference with nanochat's calculator tool (docs/nanochat.md, section 3, last paragraph), through
`model.generate()`.

The prompt is the conversation rendered with `render_for_completion` (ends in ``<|assistant_start|>``).
`CalculatorToolProcessor` is a standard `LogitsProcessor`: when a row has written ``<|python_start|>`` expr
``<|python_end|>``, expr is evaluated with `calculate`; if it gives a result, ``<|output_start|>`` result
``<|output_end|>`` is forced into that row over the next steps (every other logit masked), so generate() does
nanochat's tool use on left-padded batches and under any sampling settings. Generation stops at
``<|assistant_end|>`` (or ``<|bos|>``, as nanochat's engine) or after `max_new_tokens` tokens (forced ones count,
as in nanochat).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from .errors import UserError
from .tokenizer import render_for_completion
from .tokenizer.chat_format import (
    OUTPUT_END,
    OUTPUT_START,
    PAD_TOKEN,
    PART_TOKENS,
    PYTHON,
    PYTHON_END,
    PYTHON_OUTPUT,
    PYTHON_START,
    STOP_TOKENS,
    TEXT,
    special_token_ids,
)

# nanochat's calculator (engine.py, use_calculator; the same at 790f3be and 92d63d4): after commas are removed, an
# expression of only these characters is arithmetic (``**`` is refused) ...
_MATH_CHARS = frozenset("0123456789*+-/.() ")
# ... otherwise it must use only these, contain ".count(" and none of the names below
_STRING_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ ")
_DANGEROUS = (
    "__",
    "import",
    "exec",
    "eval",
    "compile",
    "open",
    "file",
    "input",
    "raw_input",
    "globals",
    "locals",
    "vars",
    "dir",
    "getattr",
    "setattr",
    "delattr",
    "hasattr",
)
# methods a string expression may call (nanochat's eval allows any: these are the ones that cannot blow up)
_METHODS = {
    str: frozenset(
        (
            "count",
            "find",
            "rfind",
            "index",
            "rindex",
            "startswith",
            "endswith",
            "lower",
            "upper",
            "title",
            "capitalize",
            "casefold",
            "swapcase",
            "strip",
            "lstrip",
            "rstrip",
            "split",
            "rsplit",
            "splitlines",
            "partition",
            "rpartition",
            "join",
            "removeprefix",
            "removesuffix",
            "isalpha",
            "isdigit",
            "isnumeric",
            "isdecimal",
            "isalnum",
            "isspace",
            "islower",
            "isupper",
            "istitle",
            "isascii",
            "isidentifier",
            "isprintable",
        )
    ),
    list: frozenset(("count", "index")),
    tuple: frozenset(("count", "index")),
}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_COMPARE = {
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


class _Rejected(Exception):
    """Something nanochat's eval would not run either (a name: its eval has no builtins), or that we do not run."""


def _eval(node: ast.AST) -> Any:
    """Python's own semantics for the constructs nanochat's character sets allow; anything else is rejected."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):  # only () can be written: commas are removed first
        return tuple(_eval(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Mult) and any(isinstance(v, (str, tuple, list)) and v for v in (left, right)):
            raise _Rejected("sequence repetition")  # cannot be written: only () * n can, and it gives ()
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        value = _eval(node.values[0])
        for operand in node.values[1:]:
            if bool(value) != isinstance(node.op, ast.And):  # `and` stops at a falsy value, `or` at a truthy one
                break
            value = _eval(operand)
        return value
    if isinstance(node, ast.Compare):
        left = _eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            if type(op) not in _COMPARE:
                raise _Rejected("comparison")
            right = _eval(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body) if _eval(node.test) else _eval(node.orelse)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
        receiver = _eval(node.func.value)
        if node.func.attr not in _METHODS.get(type(receiver), ()):
            raise _Rejected(f"method {node.func.attr}")
        return getattr(receiver, node.func.attr)(*(_eval(a) for a in node.args))
    raise _Rejected(type(node).__name__)


def calculate(expression: str) -> str | None:
    """The text nanochat's calculator tool forces for `expression`: ``str(result)``, or None (no result).

    As nanochat's engine (``use_calculator``, then ``str(result)``): commas are removed; an expression of digits,
    ``+ - * / ( ) .`` and spaces is arithmetic (``**`` refused), so ``10/2`` gives ``5.0``, ``0.1+0.2`` gives
    ``0.30000000000000004`` and ``%``, ``1e3``, ``**`` give None; otherwise only letters, digits, quotes,
    ``( ) . _`` and spaces, with ``.count(`` and none of nanochat's dangerous names (``'strawberry'.count('r')``
    gives ``3``). A failure (division by zero, a syntax error, a name, which nanochat's builtin-less eval cannot
    resolve) gives None, as does a result of None. nanochat evaluates with ``eval``; we walk the parsed tree by
    hand with Python's own operators and call only harmless ``str`` methods, so constructs that cannot blow up
    give nanochat's text, and the few others (generators, attribute reads, other methods) give None.
    """
    if not isinstance(expression, str):
        return None
    expression = expression.replace(",", "")
    if all(c in _MATH_CHARS for c in expression):
        if "**" in expression:
            return None
    elif (
        not all(c in _STRING_CHARS for c in expression)
        or ".count(" not in expression
        or any(name in expression.lower() for name in _DANGEROUS)
    ):
        return None
    try:  # eval() strips leading spaces, ast.parse would not
        result = _eval(ast.parse(expression.lstrip(" "), mode="eval"))
        return None if result is None else str(result)
    except (
        _Rejected,
        SyntaxError,
        ValueError,
        TypeError,
        AttributeError,
        ArithmeticError,
        RecursionError,
        MemoryError,
    ):
        return None  # str() of an int over 4300 digits raises ValueError (nanochat's engine would crash)


class CalculatorToolProcessor(LogitsProcessor):
    """Forces ``<|output_start|>`` calculate(expr) ``<|output_end|>`` after each ``<|python_start|>`` expr
    ``<|python_end|>`` a row writes; pass it to ``model.generate(logits_processor=[...])``.

    Stateless: each step it reads the row's own tokens, so it works on left-padded batches, with sampling and
    with beam search (rows may be reordered), and needs no reset between generate() calls. When the expression
    gives no result (calculate returns None) nothing is forced and the model goes on by itself, as nanochat does.
    """

    def __init__(self, tokenizer):
        ids = special_token_ids(tokenizer)
        self.tokenizer = tokenizer
        self.python_start, self.python_end = ids[PYTHON_START], ids[PYTHON_END]
        self.output_start, self.output_end = ids[OUTPUT_START], ids[OUTPUT_END]
        self.special_set = {*tokenizer.all_special_ids, *ids.values()}
        self.specials = torch.tensor(sorted(self.special_set))

    def forced_reply(self, expression_ids: list[int]) -> list[int] | None:
        """The tokens the tool writes after ``<|python_end|>`` for this expression, or None (no result)."""
        if not expression_ids:  # nanochat's engine skips an empty call
            return None
        result = calculate(self.tokenizer.decode(expression_ids, clean_up_tokenization_spaces=False))
        if result is None:
            return None
        return [self.output_start, *self.tokenizer.encode(result, add_special_tokens=False), self.output_end]

    def _next_forced(self, row: list[int], last_special: int) -> int | None:
        # row[last_special] is <|python_end|> (then it is the row's last token) or <|output_start|>
        end = last_special if row[last_special] == self.python_end else last_special - 1
        if end < 1 or row[end] != self.python_end:
            return None
        start = end - 1  # the expression: non-special tokens back to <|python_start|>
        while start >= 0 and row[start] not in self.special_set:
            start -= 1
        if start < 0 or row[start] != self.python_start:
            return None
        forced = self.forced_reply(row[start + 1 : end])
        written = row[end + 1 :]
        if forced is None or len(written) >= len(forced) or forced[: len(written)] != written:
            return None
        return forced[len(written)]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # only rows whose last special token opens or is about to open a tool output can need forcing:
        # find them with tensor ops, then walk just those rows in Python
        is_special = torch.isin(input_ids, self.specials.to(input_ids.device))
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = torch.where(is_special, positions, -1).max(dim=1).values
        last_token = input_ids.gather(1, last.clamp(min=0)[:, None])[:, 0]
        pending = (last >= 0) & (
            (last_token == self.output_start) | ((last_token == self.python_end) & (last == input_ids.shape[1] - 1))
        )
        rows, tokens = [], []
        for r in pending.nonzero()[:, 0].tolist():
            token = self._next_forced(input_ids[r].tolist(), int(last[r]))
            if token is not None:
                rows.append(r)
                tokens.append(token)
        if not rows:
            return scores
        scores = scores.clone()
        scores[rows] = float("-inf")
        scores[rows, tokens] = 0.0
        return scores


def _check_options(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise UserError(f"temperature must be >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise UserError(f"top_k must be None or a positive int, got {top_k!r}")


def fit_prompt(prompt: list[int], sequence_len: int, max_new_tokens: int) -> list[int]:
    """`prompt` cut so that prompt + `max_new_tokens` fits in `sequence_len`: the first token (``<|bos|>``) and
    the most recent tokens are kept (the model never saw longer sequences in training). Unchanged when it fits."""
    keep = sequence_len - max_new_tokens
    if len(prompt) <= keep:
        return prompt
    if keep < 2:
        raise UserError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt within the model's "
            f"sequence_len={sequence_len}"
        )
    return prompt[:1] + prompt[len(prompt) - keep + 1 :]


@torch.no_grad()
def generate_tokens(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    streamer: BaseStreamer | None = None,
    calculator: bool = True,
) -> list[list[int]]:
    """Reply tokens for each prompt (token ids), generated as one left-padded batch by ``model.generate()`` with
    the calculator tool (unless `calculator` is False: then a python block gets no forced output). Each reply ends
    at its first stop token (included) or after `max_new_tokens` tokens.

    `model` is the bare causal LM (unwrap DDP/accelerate first); it is put in eval mode while generating and
    restored after. temperature 0 = greedy; `seed` makes sampling reproducible (the global RNG is left as it was).
    """
    _check_options(max_new_tokens, temperature, top_k)
    if not prompts or not all(prompts):
        raise UserError("prompts must be a non-empty list of non-empty token id lists")
    ids = special_token_ids(tokenizer)
    stops = [ids[name] for name in STOP_TOKENS]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ids[PAD_TOKEN]
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sampling = temperature > 0.0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_k=top_k if sampling else None,
        eos_token_id=stops,
        pad_token_id=pad,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if seed is not None:
                torch.manual_seed(seed)
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([CalculatorToolProcessor(tokenizer)] if calculator else []),
                streamer=streamer,
            )
    finally:
        model.train(was_training)
    replies = []
    for row in out[:, width:].tolist():
        stop_at = next((i for i, t in enumerate(row) if t in stops), None)
        replies.append(row if stop_at is None else row[: stop_at + 1])
    return replies


def tool_part_tokens(tokenizer) -> tuple[dict[int, str], set[int], set[int]]:
    """Token ids that shape a reply: (opening token -> its part type, closing tokens, stop tokens)."""
    ids = special_token_ids(tokenizer)
    opening = {ids[start]: part for part, (start, _) in PART_TOKENS.items()}
    closing = {ids[end] for _, end in PART_TOKENS.values()}
    return opening, closing, {ids[name] for name in STOP_TOKENS}


def parts_from_tokens(tokenizer, token_ids: list[int]) -> list[dict[str, str]]:
    """Split generated reply tokens into nanochat parts: text / python / python_output (stop tokens dropped).

    An unterminated block (the budget ran out) still becomes its part.
    """
    opening, closing, stop = tool_part_tokens(tokenizer)
    parts: list[dict[str, str]] = []
    kind, run = TEXT, []

    def flush() -> None:
        if run or kind != TEXT:  # empty text between blocks is not a part; an empty python block is
            parts.append({"type": kind, "text": tokenizer.decode(run)})

    for t in token_ids:
        if t in stop:
            break
        if t in opening:
            flush()
            kind, run = opening[t], []
        elif t in closing and kind != TEXT:
            flush()
            kind, run = TEXT, []
        else:
            run.append(t)
    flush()
    return parts


def decode_completion(tokenizer, token_ids: list[int]) -> str:
    """The reply as nanochat's chat_eval decodes it for scoring: every token, the special tokens of tool blocks
    written out (``<|python_start|>12/60<|python_end|><|output_start|>0.2<|output_end|>``), the stop token that
    ended it left out, decoded as one sequence."""
    _, _, stop = tool_part_tokens(tokenizer)
    if token_ids and token_ids[-1] in stop:
        token_ids = token_ids[:-1]
    return tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _reply(tokenizer, tokens: list[int], stops: tuple[int, int]) -> dict[str, Any]:
    parts = parts_from_tokens(tokenizer, tokens)
    return {
        "message": {"role": "assistant", "content": parts},
        "parts": parts,
        "text": "".join(p["text"] for p in parts if p["type"] == TEXT),
        "completion": decode_completion(tokenizer, tokens),
        "token_ids": tokens,
        "finish_reason": "stop" if tokens and tokens[-1] in stops else "length",
    }


def generate_replies(
    model,
    tokenizer,
    conversations: list[Mapping | list],
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """The assistant's reply to each conversation (nanochat format, last message from the user), generated as
    one left-padded batch; see `generate_reply` for what each reply holds."""
    _check_options(max_new_tokens, temperature, top_k)  # before rendering: bad options fail first
    prompts = [render_for_completion(tokenizer, c) for c in conversations]
    ids = special_token_ids(tokenizer)
    stops = tuple(ids[name] for name in STOP_TOKENS)
    return [
        _reply(tokenizer, tokens, stops)
        for tokens in generate_tokens(model, tokenizer, prompts, max_new_tokens, temperature, top_k, seed)
    ]


def generate_reply(
    model,
    tokenizer,
    conversation: Mapping | list,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Generate the assistant's reply to `conversation` (nanochat format, last message from the user).

    Returns {"message": {"role": "assistant", "content": parts}, "parts": parts, "text": the text parts joined,
    "completion": the whole reply decoded as nanochat scores it (`decode_completion`), "token_ids": every reply
    token (forced ones and the stop token included), "finish_reason": "stop" or "length"}. Append
    result["message"] to the conversation to continue the chat. temperature 0 = greedy; `seed` makes sampling
    reproducible.
    """
    return generate_replies(model, tokenizer, [conversation], max_new_tokens, temperature, top_k, seed)[0]


def format_parts(parts: list[dict[str, str]]) -> str:
    """Readable one-string form of a reply: calculator calls as ``<<expr=result>>`` (GSM8K style)."""
    out = []
    for i, part in enumerate(parts):
        if part["type"] == TEXT:
            out.append(part["text"])
        elif part["type"] == PYTHON:
            following = parts[i + 1] if i + 1 < len(parts) else None
            result = following["text"] if following and following["type"] == PYTHON_OUTPUT else "?"
            out.append(f"<<{part['text']}={result}>>")
        elif i == 0 or parts[i - 1]["type"] != PYTHON:  # an output the model wrote without a call
            out.append(f"<<={part['text']}>>")
    return "".join(out)


__all__ = [
    "CalculatorToolProcessor",
    "calculate",
    "decode_completion",
    "fit_prompt",
    "format_parts",
    "generate_replies",
    "generate_reply",
    "generate_tokens",
    "parts_from_tokens",
    "tool_part_tokens",
]
