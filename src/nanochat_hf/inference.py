"""Chat inference with nanochat's calculator tool (spec section 3, last paragraph).

The prompt is the conversation rendered with `render_for_completion` (ends in ``<|assistant_start|>``).
Tokens are generated one at a time on a KV cache. When the model writes ``<|python_start|>`` expr
``<|python_end|>``, expr is evaluated with `calculate`; if it gives a result, ``<|output_start|>`` result
``<|output_end|>`` is forced into the sequence (fed to the model in one forward) and generation goes on.
Generation stops at ``<|assistant_end|>`` (or ``<|bos|>``, as nanochat's engine) or after `max_new_tokens`
tokens (forced ones count, as in nanochat).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .tokenizer import render_for_completion

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 1024  # about 308 decimal digits: any int beyond this (also as an intermediate) gives None

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


class _Rejected(Exception):
    """The expression uses something the calculator does not allow."""


def _power(base: int | float, exp: int | float) -> int | float:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        # bound the size before computing: |base|**exp has about bit_length * exp bits
        if (abs(base).bit_length() - 1) * exp > MAX_INT_BITS:
            raise _Rejected("power too large")
    result = base ** exp  # float overflow raises OverflowError
    if isinstance(result, complex):  # e.g. (-8) ** 0.5
        raise _Rejected("complex result")
    return result


def _eval(node: ast.AST) -> int | float | str:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        # bool is an int subclass: excluded, as are complex, bytes, None
        if type(node.value) in (int, float, str):
            return node.value
        raise _Rejected("literal")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _number(_eval(node.operand))
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        left, right = _number(_eval(node.left)), _number(_eval(node.right))
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        op = _BINARY.get(type(node.op))
        if op is None:
            raise _Rejected("operator")
        return op(left, right)
    if isinstance(node, ast.Call):
        # only  'literal'.count('literal')
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "count" and not node.keywords and len(node.args) == 1
                and isinstance(func.value, ast.Constant) and type(func.value.value) is str
                and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is str):
            return func.value.value.count(node.args[0].value)
    raise _Rejected(type(node).__name__)


def _number(value: int | float | str) -> int | float:
    if isinstance(value, str):  # strings only as the receiver/argument of .count
        raise _Rejected("string in arithmetic")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _Rejected("integer too large")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:  # 10/2 -> "5" (GSM8K's tool outputs are written that way)
        return str(int(value))
    return format(value, ".12g")  # 0.1+0.2 -> "0.3", 5/2 -> "2.5"


def calculate(expression: str) -> str | None:
    """Evaluate a calculator expression as nanochat's tool does, safely; None when it is not allowed or fails.

    Allowed: int/float literals, + - * / // % **, unary + -, parentheses, and ``'text'.count('t')`` on string
    literals. Commas are dropped from expressions without quotes ("1,200*3" -> "3600"), as nanochat does.
    Integers are bounded to `MAX_INT_BITS` bits (huge powers give None); division by zero, float overflow,
    inf/nan and complex results give None. Parsed with `ast` and walked by hand: nothing is ever eval'ed.
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    if "'" not in expression and '"' not in expression:
        expression = expression.replace(",", "")
    try:
        result = _number(_eval(ast.parse(expression.strip(), mode="eval")))
    except (_Rejected, SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError):
        return None
    if isinstance(result, float) and not math.isfinite(result):
        return None
    return _format(result)


def _special_ids(tokenizer) -> dict[str, int]:
    names = ("<|bos|>", "<|assistant_end|>", "<|python_start|>", "<|python_end|>", "<|output_start|>",
             "<|output_end|>")
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in names}
    missing = [name for name, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks nanochat special tokens {missing}: not a nanochat tokenizer")
    return ids


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> int:
    if temperature == 0.0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _check_options(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")


def iter_reply_tokens(model, tokenizer, conversation: Mapping | list, max_new_tokens: int = 256,
                      temperature: float = 0.0, top_k: int | None = None,
                      seed: int | None = None) -> Iterator[tuple[int, bool]]:
    """Yield (token_id, forced) for each token of the assistant reply, the final stop token included.

    `forced` is True for the calculator's ``<|output_start|>`` result ``<|output_end|>`` tokens. `model` is the
    bare causal LM (unwrap DDP/accelerate first); it is put in eval mode while generating and restored after.
    Bad options and conversations raise ValueError here, before the first token.
    """
    _check_options(max_new_tokens, temperature, top_k)
    ids = _special_ids(tokenizer)
    prompt = render_for_completion(tokenizer, conversation)
    return _generate(model, tokenizer, prompt, ids, max_new_tokens, temperature, top_k, seed)


@torch.no_grad()
def _generate(model, tokenizer, prompt: list[int], ids: dict[str, int], max_new_tokens: int, temperature: float,
              top_k: int | None, seed: int | None) -> Iterator[tuple[int, bool]]:
    stop = {ids["<|assistant_end|>"], ids["<|bos|>"]}
    device = next(model.parameters()).device
    generator = None
    if seed is not None and temperature > 0.0:
        generator = torch.Generator(device=device).manual_seed(seed)

    was_training = model.training
    model.eval()
    try:
        feed = prompt
        cache = None
        produced = 0
        in_python, expr = False, []
        while produced < max_new_tokens:
            out = model(input_ids=torch.tensor([feed], device=device), past_key_values=cache, use_cache=True,
                        logits_to_keep=1)
            cache = out.past_key_values
            token = _sample(out.logits[0, -1], temperature, top_k, generator)
            produced += 1
            yield token, False
            if token in stop:
                return
            feed = [token]
            if token == ids["<|python_start|>"]:
                in_python, expr = True, []
            elif token == ids["<|python_end|>"] and in_python:
                in_python = False
                result = calculate(tokenizer.decode(expr)) if expr else None
                if result is not None:  # no result: the model goes on by itself (nanochat does the same)
                    forced = [ids["<|output_start|>"], *tokenizer.encode(result, add_special_tokens=False),
                              ids["<|output_end|>"]]
                    forced = forced[:max_new_tokens - produced]
                    for t in forced:
                        yield t, True
                    produced += len(forced)
                    feed += forced
            elif in_python:
                expr.append(token)
    finally:
        model.train(was_training)


def parts_from_tokens(tokenizer, token_ids: list[int]) -> list[dict[str, str]]:
    """Split generated reply tokens into nanochat parts: text / python / python_output (stop tokens dropped).

    An unterminated block (the budget ran out) still becomes its part.
    """
    ids = _special_ids(tokenizer)
    opening = {ids["<|python_start|>"]: "python", ids["<|output_start|>"]: "python_output"}
    closing = {ids["<|python_end|>"], ids["<|output_end|>"]}
    stop = {ids["<|assistant_end|>"], ids["<|bos|>"]}
    parts: list[dict[str, str]] = []
    kind, run = "text", []

    def flush() -> None:
        if run or kind != "text":  # empty text between blocks is not a part; an empty python block is
            parts.append({"type": kind, "text": tokenizer.decode(run)})

    for t in token_ids:
        if t in stop:
            break
        if t in opening:
            flush()
            kind, run = opening[t], []
        elif t in closing and kind != "text":
            flush()
            kind, run = "text", []
        else:
            run.append(t)
    flush()
    return parts


def generate_reply(model, tokenizer, conversation: Mapping | list, max_new_tokens: int = 256,
                   temperature: float = 0.0, top_k: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """Generate the assistant's reply to `conversation` (nanochat format, last message from the user).

    Returns {"message": {"role": "assistant", "content": parts}, "parts": parts, "text": the text parts joined,
    "token_ids": every reply token (forced ones and the stop token included), "finish_reason": "stop" or
    "length"}. Append result["message"] to the conversation to continue the chat. temperature 0 = greedy;
    `seed` makes sampling reproducible.
    """
    tokens = [t for t, _ in iter_reply_tokens(model, tokenizer, conversation, max_new_tokens, temperature, top_k,
                                              seed)]
    ids = _special_ids(tokenizer)
    stopped = bool(tokens) and tokens[-1] in (ids["<|assistant_end|>"], ids["<|bos|>"])
    parts = parts_from_tokens(tokenizer, tokens)
    return {
        "message": {"role": "assistant", "content": parts},
        "parts": parts,
        "text": "".join(p["text"] for p in parts if p["type"] == "text"),
        "token_ids": tokens,
        "finish_reason": "stop" if stopped else "length",
    }


def format_parts(parts: list[dict[str, str]]) -> str:
    """Readable one-string form of a reply: calculator calls as ``<<expr=result>>`` (GSM8K style)."""
    out = []
    for i, part in enumerate(parts):
        if part["type"] == "text":
            out.append(part["text"])
        elif part["type"] == "python":
            following = parts[i + 1] if i + 1 < len(parts) else None
            result = following["text"] if following and following["type"] == "python_output" else "?"
            out.append(f"<<{part['text']}={result}>>")
        elif i == 0 or parts[i - 1]["type"] != "python":  # an output the model wrote without a call
            out.append(f"<<={part['text']}>>")
    return "".join(out)


__all__ = ["calculate", "format_parts", "generate_reply", "iter_reply_tokens", "parts_from_tokens"]
