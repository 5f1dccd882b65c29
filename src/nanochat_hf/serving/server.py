"""The OpenAI-compatible server: three endpoints (``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, the ones docs/serving.md lists) and a chat page at ``/`` (``chat.html``) on a FastAPI app run by
uvicorn, answering with transformers serve's response objects (its chat handler's builders and field check),
generating with our ``Batcher`` (in a process of its own by default: ``engine``).

Why not ``transformers serve``'s app itself (``build_server``): it also serves ``/load_model`` (loads any local
directory a client names), ``/reset`` (unloads the model), ``/v1/completions``, ``/v1/responses`` and audio, none of
which knows nanochat's chat format; its routes parse the JSON body on the event loop; and its generation (one
request at a time, or continuous batching with one greedy config for all and no calculator) cannot serve nanochat's
calculator, per-request sampling or G5's smear together (see ``batcher``).

What keeps one client from blocking the others: the body is read with a size limit (``Guard``, before it is read
whole) and a time limit; JSON parsing, the checks and tokenization run in a worker thread, never on the event loop;
a conversation that cannot fit the context is refused from its length in bytes before it is tokenized; prompt plus
``max_tokens`` must fit the context (400 otherwise); a full queue answers 429; a client that goes away (streamed or
not) has its row dropped before the next decoding step.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import ipaddress
import json
import socket
import sys
import threading
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from openai.types.completion_usage import CompletionUsage
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from transformers import AutoTokenizer, PretrainedConfig
from transformers.cli.serving.chat_completion import ChatCompletionHandler, TransformersCompletionCreateParamsStreaming
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..errors import UserError
from ..model import NanoChatGPTConfig
from ..tokenizer import render_for_completion
from ..tokenizer.chat_format import OUTPUT_END, OUTPUT_START, PYTHON_END, PYTHON_START, STOP_TOKENS, special_token_ids
from ..tokenizer.tokenizer import token_to_bytes
from ..training.device import check_num_threads, use_cpu_threads
from .batcher import Batcher, Job, QueueFull, ShuttingDown
from .cli import ServeOptions
from .engine import EngineProcess, load_model

ENDPOINTS = ("/v1/chat/completions", "/v1/models", "/health")  # docs/serving.md lists these; else only the page
OPEN = "/health"  # the one endpoint an API key does not guard (load balancers probe it)
PAGE = "/"  # the chat page (chat.html; --no-page: none): open too, it asks for the key and sends it itself
# the page may run its own inline script and style and talk to this server, nothing else (no asset from elsewhere)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
MAX_STOP_STRINGS = 4  # OpenAI's limit on `stop`
MAX_STOP_CHARS = 100  # each is searched for at every token: long ones would slow everyone's decoding
MAX_TEMPERATURE = 2.0  # OpenAI's range
MAX_SEED = 2**63 - 1
SHUTDOWN_SECONDS = 3  # Ctrl-C: requests in flight get an error at once; connections are closed after this
# fields of the API this server does not implement: refused (400) unless null or a value that changes nothing
UNSUPPORTED = {
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (),
    "response_format": ({"type": "text"},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "n": (1,),
    "top_p": (1,),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "generation_config": (),
    "chat_template_kwargs": (),
}
CALCULATOR = "nanochat's one tool is its calculator, on by default (extra_body={'calculator': false} turns it off)"
WHY = {
    "tools": CALCULATOR,
    "tool_choice": CALCULATOR,
    "top_p": "nanochat samples with temperature and top_k",
    "n": "one reply per request",
}


class ChatParams(TransformersCompletionCreateParamsStreaming, total=False):
    """The request fields the API has (OpenAI's and transformers'), plus ours (sent through ``extra_body``)."""

    calculator: bool
    top_k: int


def say(line: str) -> None:
    print(f"serve: {line}", file=sys.stderr, flush=True)


def bad(message: str, status: int = 400) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


def error_response(status: int, message: str, close: bool = False) -> JSONResponse:
    """OpenAI's error body: the official client shows error.message. `close`: uvicorn closes the connection after
    it (the rest of a refused body is then not received at all)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"Connection": "close"} if close else None
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status, headers=headers
    )


class ReplyText:
    """One reply's text as the client reads it, built as its tokens arrive: text decoded run by run, every special
    token left out (stop tokens included), a calculator call as ``inference.format_parts`` writes it:
    ``<<expr=result>>``, ``<<expr=?>>`` when no result followed, ``<<=output>>`` for an output without a call.

    ``text(final=False)`` (a reply still growing) leaves out a call not yet closed, so the text only grows (but for
    a last character whose bytes are not all there yet): streaming sends the growth. Decoded text is kept once its
    characters are whole (byte-level BPE: a decoding that ends on a whole character is never changed by the tokens
    after it), so each token costs the same however long the reply is."""

    CLOSE = {"call": "=?>>", "called": "?>>", "output": ">>"}  # how a block still open at the end is closed

    def __init__(self, tokenizer):
        ids = special_token_ids(tokenizer)
        self.tokenizer = tokenizer
        self.special = set(tokenizer.all_special_ids) | set(ids.values())
        self.python_start, self.python_end = ids[PYTHON_START], ids[PYTHON_END]
        self.output_start, self.output_end = ids[OUTPUT_START], ids[OUTPUT_END]
        self.settled = ""  # text that no later token changes
        self.open = ""  # a tool block not closed yet ("<<expr=", ...): held back until it is
        self.block: str | None = None  # the open block: "call", "called" (after <|python_end|>), "output"
        self.run: list[int] = []  # text tokens whose characters are not whole yet

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, clean_up_tokenization_spaces=False)

    def _put(self, text: str) -> None:
        if self.block is None:
            self.settled += text
        else:
            self.open += text

    def _close(self, mark: str) -> None:
        self.settled += self.open + mark
        self.open, self.block = "", None

    def add(self, tokens: list[int]) -> None:
        for t in tokens:
            if t not in self.special:
                if self.block == "called":  # text after a call with no output: the call had no result
                    self._close("?>>")
                self.run.append(t)
                text = self._decode(self.run)
                if not text.endswith("\ufffd"):
                    self._put(text)
                    self.run = []
                continue
            if self.run:  # a special token ends the run, whole characters or not
                self._put(self._decode(self.run))
                self.run = []
            if t == self.python_start:
                if self.block == "called":
                    self._close("?>>")
                self.settled += self.open
                self.open, self.block = "<<", "call"
            elif t == self.python_end and self.block == "call":
                self.open += "="
                self.block = "called"
            elif t == self.output_start:
                if self.block != "called":  # an output without a call
                    self.settled += self.open
                    self.open = "<<="
                self.block = "output"
            elif t == self.output_end and self.block == "output":
                self._close(">>")
            elif self.block == "called":  # another special token after a call: no result either
                self._close("?>>")

    def text(self, final: bool = True) -> str:
        tail = self._decode(self.run) if self.run else ""
        if self.block is None:
            return self.settled + tail
        return self.settled + self.open + tail + self.CLOSE[self.block] if final else self.settled


class ReplyStream:
    """The batcher's sink for one request: reply tokens in, text deltas out on an asyncio queue, then one final
    dict: ``{"finish_reason", "completion_tokens"}`` or ``{"error": message, "status": code}``.

    Stop strings: the text ends before the first one, generation is stopped there; text that may be the start of
    a stop string is held back until it cannot be."""

    def __init__(self, text: ReplyText, stops: set[int], stop_strings: list[str], loop, queue: asyncio.Queue):
        self.text, self.stops, self.stop_strings = text, stops, stop_strings
        self.loop, self.queue = loop, queue
        self.tokens: list[int] = []
        self.sent = ""
        self.finished = False
        self.stopped_by_string = False
        self.cancelled = threading.Event()  # set from the event loop when the client has gone

    def _emit(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def add(self, new_tokens: list[int]) -> None:
        if self.finished:
            return
        for t in new_tokens:
            self.tokens.append(t)
            self.text.add([t])
            if t in self.stops:
                break
        stopped = bool(self.tokens) and self.tokens[-1] in self.stops
        text = self.text.text(final=stopped)
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped_by_string = True
            self._send(text[:cut])
            self._finish()
            return
        if stopped:
            self._finish()
            return
        hold = len(text) - len(text.rstrip("\ufffd"))  # an incomplete character
        for s in self.stop_strings:  # the longest end of the text that begins a stop string
            hold = max(hold, next((n for n in range(min(len(s) - 1, len(text)), 0, -1) if s.startswith(text[-n:])), 0))
        self._send(text[: len(text) - hold])

    def end(self) -> None:  # max_tokens reached
        self._finish()

    def _send(self, text: str) -> None:
        if len(text) > len(self.sent):
            self._emit(text[len(self.sent) :])
            self.sent = text

    def _finish(self) -> None:
        if self.finished:
            return
        if not self.stopped_by_string:
            self._send(self.text.text())
        self.finished = True
        stop = self.stopped_by_string or (self.tokens and self.tokens[-1] in self.stops)
        self._emit({"finish_reason": "stop" if stop else "length", "completion_tokens": len(self.tokens)})

    def fail(self, message: str, status: int = 500) -> None:
        if not self.finished:
            self.finished = True
            self._emit({"error": message, "status": status})


def _number(body: dict, name: str, kind: type, low: float, high: float, default: Any = None) -> Any:
    """body[name] as `kind`, from `low` to `high`; a 400 naming the field otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float) if kind is float else int)
        or not low <= value <= high
    ):
        word = "an integer" if kind is int else "a number"
        raise bad(f"{name} must be {word} from {low} to {high}, got {json.dumps(value)[:40]}")
    return kind(value)


@dataclass
class ChatRequest:
    messages: list[dict]
    max_tokens: int | None
    temperature: float
    top_k: int | None
    seed: int | None
    stop: list[str]
    calculator: bool
    stream: bool

    @classmethod
    def parse(cls, body: dict, calculator_default: bool, vocab_size: int, context: int) -> ChatRequest:
        """The request's generation settings, each checked (HTTP 400 with one line naming the field)."""
        for name, neutral in UNSUPPORTED.items():
            value = body.get(name)
            if value is not None and not any(
                value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral
            ):
                why = WHY.get(name, "see docs/serving.md")
                raise bad(f"{name} is not supported by this server ({why}), got {json.dumps(value)[:40]}")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise bad("messages must be a non-empty list of {role, content} objects")
        max_tokens = _number(body, "max_completion_tokens", int, 1, context)
        if max_tokens is None:
            max_tokens = _number(body, "max_tokens", int, 1, context)
        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)
        ):
            raise bad(
                f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} "
                "characters"
            )
        for flag in ("calculator", "stream"):
            if not isinstance(body.get(flag, False), bool):
                raise bad(f"{flag} must be true or false, got {json.dumps(body[flag])[:40]}")
        return cls(
            messages=[{"role": m.get("role"), "content": m.get("content")} for m in messages],
            max_tokens=max_tokens,
            temperature=_number(body, "temperature", float, 0.0, MAX_TEMPERATURE, default=0.0),
            top_k=_number(body, "top_k", int, 1, vocab_size),
            seed=_number(body, "seed", int, 0, MAX_SEED),
            stop=stop,
            calculator=body.get("calculator", calculator_default),
            stream=body.get("stream", False),
        )


def _text_bytes(messages: list[dict]) -> int:
    """Bytes of the conversation's text (string contents and text parts; what is not a string is the renderer's
    to refuse)."""
    total = 0
    for m in messages:
        content = m["content"]
        parts = [content] if isinstance(content, str) else [p.get("text") for p in content if isinstance(p, dict)]
        total += sum(len(p.encode()) for p in parts if isinstance(p, str))
    return total


class NanoChatCompletionHandler(ChatCompletionHandler):
    """/v1/chat/completions for a nanochat model: the request's checks, nanochat's rendering and stop tokens, the
    reply from the batcher. Of transformers' handler it uses the response builders and the field check only."""

    _valid_params_class = ChatParams

    def __init__(
        self, name: str, config: PretrainedConfig, tokenizer, batcher: Batcher | EngineProcess, calculator: bool
    ):
        super().__init__(model_manager=None, generation_state=None)
        self.name, self.tokenizer, self.batcher, self.calculator = name, tokenizer, batcher, calculator
        self.context, self.vocab_size = config.sequence_len, config.vocab_size
        ids = special_token_ids(tokenizer)
        self.stops = {ids[name] for name in STOP_TOKENS}
        # the longest token's bytes: a text of N bytes is at least N / this many tokens (refused untokenized)
        special = set(tokenizer.all_special_tokens)
        self.token_bytes = max(len(token_to_bytes(t)) for t in tokenizer.get_vocab() if t not in special)

    def prepare(self, raw: bytes) -> tuple[ChatRequest, list[int]]:
        """The request and its prompt ids, or a 4xx. Runs in a worker thread (parsing and tokenizing a large body
        would hold the event loop)."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        self._validate_request(body)  # transformers': a field the API does not have -> 422
        if body.get("model") not in (None, self.name):
            raise bad(f"model {str(body['model'])[:80]!r} is not served here: this server serves {self.name!r}", 404)
        request = ChatRequest.parse(body, self.calculator, self.vocab_size, self.context)
        try:
            least = _text_bytes(request.messages) // self.token_bytes
        except (AttributeError, TypeError):  # a malformed message: the renderer says which
            least = 0
        if least >= self.context:
            raise bad(
                f"the conversation is at least {least} tokens, the model's context (sequence_len) is {self.context}"
            )
        try:
            prompt = render_for_completion(self.tokenizer, {"messages": request.messages}, max_tokens=None)
        except UserError as e:
            raise bad(str(e)) from None
        if len(prompt) >= self.context:
            raise bad(f"the conversation is {len(prompt)} tokens, the model's context (sequence_len) is {self.context}")
        room = self.context - len(prompt)
        if request.max_tokens is not None and request.max_tokens > room:
            raise bad(
                f"max_tokens {request.max_tokens} and the conversation's {len(prompt)} tokens exceed the model's "
                f"context (sequence_len) {self.context}: ask for at most {room}"
            )
        return request, prompt

    async def handle(self, request: Request, raw: bytes) -> StreamingResponse | JSONResponse:
        chat, prompt = await asyncio.to_thread(self.prepare, raw)
        queue: asyncio.Queue = asyncio.Queue()
        stream = ReplyStream(ReplyText(self.tokenizer), self.stops, chat.stop, asyncio.get_running_loop(), queue)
        job = Job(
            prompt=prompt,
            max_new=chat.max_tokens or self.context - len(prompt),
            temperature=chat.temperature,
            top_k=chat.top_k,
            seed=chat.seed,
            calculator=chat.calculator,
            sink=stream,
        )
        if await request.is_disconnected():  # gone while it was checked (sent, then hung up): no prefill for it
            return Response(status_code=499)
        try:
            self.batcher.submit(job)
        except QueueFull:
            raise bad(
                f"the server is busy (its queue of {self.batcher.max_queue} is full): try again later", 429
            ) from None
        except ShuttingDown as e:
            raise bad(str(e) or "the server is shutting down", 503) from None
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        usage = {"prompt_tokens": len(prompt)}
        if chat.stream:
            return StreamingResponse(self._sse(queue, stream, request_id, usage), media_type="text/event-stream")
        content, final = await self._collect(request, queue, stream)
        if "error" in final:
            raise bad(final["error"], final["status"])
        completion = self._build_completion(
            request_id, content, self.name, final["finish_reason"], usage=self._usage(usage, final)
        )
        return JSONResponse(completion)

    async def _collect(self, request: Request, queue: asyncio.Queue, stream: ReplyStream) -> tuple[str, dict]:
        """The whole reply; if the client goes away first, its generation is cancelled."""
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            content = ""
            while True:
                item = asyncio.ensure_future(queue.get())
                await asyncio.wait({item, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not item.done():
                    item.cancel()
                    stream.cancelled.set()
                    return content, {"error": "the client went away", "status": 499}
                if isinstance(item.result(), str):
                    content += item.result()
                else:
                    return content, item.result()
        finally:
            gone.cancel()

    def _usage(self, usage: dict, final: dict) -> CompletionUsage:
        done = final["completion_tokens"]
        return CompletionUsage(
            prompt_tokens=usage["prompt_tokens"], completion_tokens=done, total_tokens=usage["prompt_tokens"] + done
        )

    async def _sse(self, queue, stream: ReplyStream, request_id: str, usage: dict) -> AsyncGenerator[str, None]:
        try:
            yield self._build_chunk_sse(request_id, role="assistant", model=self.name)
            while True:
                item = await queue.get()
                if isinstance(item, str):
                    yield self._build_chunk_sse(request_id, content=item, model=self.name)
                elif "error" in item:
                    yield f"data: {json.dumps({'error': {'message': item['error'], 'code': item['status']}})}\n\n"
                    return
                else:
                    final_usage = self._usage(usage, item)
                    yield self._build_chunk_sse(
                        request_id, finish_reason=item["finish_reason"], model=self.name, usage=final_usage
                    )
                    yield "data: [DONE]\n\n"
                    return
        finally:  # done, or the client went away (the generator is closed or cancelled): stop generating for it
            stream.cancelled.set()


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed its connection (the body has been read: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Guard:
    """ASGI middleware in front of everything: the API key (401, before anything is read), then the body's size
    (413 from Content-Length before a byte of it is read, or as soon as a chunked body passes the limit), then a
    POST's Content-Type (415 unless JSON: a web page of any origin may POST a form or text/plain to a server on
    this machine without asking first, as a "simple" request; a JSON one needs the CORS preflight, refused unless
    --cors-origin allows that origin)."""

    def __init__(self, app, api_key: str | None, max_bytes: int, open_paths: tuple[str, ...] = (OPEN,)):
        self.app, self.max_bytes, self.open_paths = app, max_bytes, open_paths
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.expected and scope["path"] not in self.open_paths:
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                message = "a valid API key is needed: send the header 'Authorization: Bearer KEY'"
                return await error_response(401, message)(scope, receive, send)
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            return await error_response(413, self._too_large(), close=True)(scope, receive, send)
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope["method"] == "POST" and kind != b"application/json":  # a browser's form or text/plain: no preflight
            got = repr(kind.decode("latin-1")[:40]) if kind else "none"
            message = f"the request body must be JSON, sent with 'Content-Type: application/json' (got {got})"
            return await error_response(415, message, close=True)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise bad(self._too_large(), 413)
            return message

        return await self.app(scope, counted, send)

    def _too_large(self) -> str:
        return f"the request body is larger than this server takes ({self.max_bytes} bytes, --max-request-bytes)"


def build_app(handler: NanoChatCompletionHandler, batcher: Batcher | EngineProcess, options: ServeOptions) -> Any:
    """The endpoints of docs/serving.md and nothing else (no /docs or /openapi.json either)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            raw = await asyncio.wait_for(request.body(), options.body_seconds)
        except asyncio.TimeoutError:
            raise bad(f"the request body did not arrive within {options.body_seconds:g} s", 408) from None
        except ClientDisconnect:  # gone before its body was in: nobody to answer
            return Response(status_code=499)
        return await handler.handle(request, raw)

    @app.get("/v1/models")
    def list_models():
        model = {"id": handler.name, "object": "model", "created": 0, "owned_by": "local"}
        return JSONResponse({"object": "list", "data": [model]})

    if not options.no_page:
        page = importlib.resources.files(__package__).joinpath("chat.html").read_text(encoding="utf-8")

        @app.get(PAGE)
        def chat_page():
            return HTMLResponse(page, headers=PAGE_HEADERS)

    @app.get(OPEN)
    def health():
        if not batcher.alive():
            return error_response(503, "generation has stopped (the server's log says why)")
        return JSONResponse({"status": "ok"})

    async def http_error(_request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404 and e.detail == "Not Found":  # the router's: no such endpoint
            return error_response(404, f"no such endpoint: this server serves {', '.join(ENDPOINTS)}")
        return error_response(e.status_code, str(e.detail), close=e.status_code in (408, 413))

    async def server_error(_request, e: Exception) -> JSONResponse:  # details (paths) go to the log, not the client
        return error_response(500, "internal server error (the server's log says why)")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    guarded = Guard(app, options.api_key, options.max_request_bytes, (OPEN,) if options.no_page else (OPEN, PAGE))
    if not options.cors_origin:
        return guarded
    # outside the guard: a browser's preflight request carries no API key
    return CORSMiddleware(
        guarded,
        allow_origins=options.cors_origin,
        allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type"],
    )


def _check_model_dir(path: Path) -> NanoChatGPTConfig:
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: no config.json here (expected a model directory written by save_pretrained)")
    try:
        config = NanoChatGPTConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}/config.json: not a nanochat-hf model config ({e})") from e
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"{path}: no tokenizer here (save the tokenizer beside the model)")
    return config


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: a free one), as uvicorn binds one (IPv6 for an address with ':'), but
    before the model loads and as a one-line error: a port in use, a host that does not resolve or is not this
    machine's is said at once, and what the server announces is what listens."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:  # socket.gaierror (a host that does not resolve) is one too
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror or e}): see --host and --port") from None
    sock.listen()  # connections wait in its backlog until uvicorn takes them (it listens again, with its backlog)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


class HeadLimit(AutoHTTPProtocol):
    """uvicorn's HTTP protocol (httptools, or h11 where it is missing) that closes a connection whose request head
    (request line and headers) is not whole ``seconds`` after the connection opened or after the head's first byte.
    uvicorn has no such limit: its keep-alive timeout is cancelled by any byte, and a new connection has none, so a
    client sending its head a byte a second held its connection, and a socket, for ever. An idle kept-alive
    connection is still uvicorn's to close (``timeout_keep_alive``, 5 s)."""

    seconds = ServeOptions.head_seconds  # the server's own: ``HeadLimit.limited(seconds)``

    @classmethod
    def limited(cls, seconds: float) -> type[HeadLimit]:
        return type(cls.__name__, (cls,), {"seconds": seconds})

    def connection_made(self, transport) -> None:
        self.head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        waiting = self.cycle is None or self.cycle.response_complete  # for the next request's head
        if waiting and self.head_timer is None:
            self._arm()
        super().data_received(data)  # parses at once: a whole head starts its request here
        if self.cycle is not None and not self.cycle.response_complete and self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.head_timer = self.loop.call_later(self.seconds, self.transport.close)


class Server(uvicorn.Server):
    """uvicorn's server on the socket ``listen`` bound, that stops the batcher first when it shuts down (the
    requests in flight get an error at once, so the connections close and Ctrl-C ends it within seconds)."""

    def __init__(self, config: uvicorn.Config, batcher: Batcher | EngineProcess, sock: socket.socket):
        super().__init__(config)
        self.batcher, self.socket = batcher, sock
        self.port = sock.getsockname()[1]  # the one listening (--port 0: the free port the system chose)

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets=sockets or [self.socket])

    async def shutdown(self, sockets=None) -> None:
        await asyncio.to_thread(self.batcher.stop)
        await super().shutdown(sockets)


def _load(path: Path, config: NanoChatGPTConfig, options: ServeOptions) -> tuple[NanoChatCompletionHandler, str]:
    """The model (in its own process, or in a thread of this one) and the chat handler around it; the device."""
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cpu"):  # measured once, at start: requests come later, on the cores idle then
        say(use_cpu_threads(options.num_threads, flag="--num-threads"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if options.engine == "process":  # the child loads the weights: the server's process never holds them
        batcher = EngineProcess(
            path, options.dtype, device, torch.get_num_threads(), options.max_batch, options.max_queue
        )
    else:
        batcher = Batcher(load_model(path, options.dtype, device), tokenizer, options.max_batch, options.max_queue)
    name = options.name or path.resolve().name
    return NanoChatCompletionHandler(name, config, tokenizer, batcher, calculator=not options.no_calculator), device


def start(options: ServeOptions) -> Server:
    """Bind the socket, load the model and build the server around them; returns the uvicorn server (``.run()``
    serves)."""
    path = Path(options.model)
    model_config = _check_model_dir(path)
    check_num_threads(options.num_threads, f"--num-threads {options.num_threads}")
    sock = listen(options.host, options.port)  # before the model loads: a port in use is said at once
    try:
        handler, device = _load(path, model_config, options)
    except BaseException:  # nothing is left bound
        sock.close()
        raise
    app = build_app(handler, handler.batcher, options)
    say(f"{_url(sock)}/v1 serves {handler.name!r} ({path}) on {device}")
    if not options.no_page:
        say(f"the chat page: {_url(sock)}/")
    if not options.api_key and not _loopback(options.host):
        say(f"warning: listening on {options.host} without an API key: anyone who can reach it can use it (--api-key)")
    config = uvicorn.Config(
        app,
        http=HeadLimit.limited(options.head_seconds),
        log_level=options.log_level,
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
    )
    return Server(config, handler.batcher, sock)
