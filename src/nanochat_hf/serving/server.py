"""transformers' server (``transformers serve``: its FastAPI app, model manager, generation thread and continuous
batching manager) serving a nanochat-hf model.

``transformers serve DIR --trust-remote-code`` cannot load a remote-code model (its model manager looks the
architecture up in the transformers namespace), and its chat handler knows nothing of nanochat's chat format, stop
tokens or calculator tool. So this module builds the same app as ``transformers serve`` with two parts of ours:
a model manager that loads the directory with our class, and a chat completions handler that renders the
conversation as nanochat does, generates with ``inference.generate_tokens`` (the calculator tool on, unless the
request says ``"calculator": false``) on transformers' generation thread, or through transformers' continuous
batching manager, and turns the reply tokens into the text a client sees (``reply_text``). Everything else
(routes, request ids, /v1/models, /health, response objects, the other endpoints) is transformers'.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types.completion_usage import CompletionUsage
from starlette.exceptions import HTTPException
from transformers import AutoTokenizer, ContinuousBatchingConfig, GenerationConfig
from transformers.cli.serving.chat_completion import ChatCompletionHandler, TransformersCompletionCreateParamsStreaming
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.model_manager import ModelManager
from transformers.cli.serving.response import ResponseHandler
from transformers.cli.serving.server import build_server
from transformers.cli.serving.systemone import SystemOneHandler
from transformers.cli.serving.transcription import TranscriptionHandler
from transformers.cli.serving.utils import CBGenerateManager, GenerationState
from transformers.generation.streamers import BaseStreamer

from ..errors import UserError
from ..inference import generate_tokens
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from ..tokenizer import render_for_completion
from ..tokenizer.chat_format import (
    OUTPUT_END,
    OUTPUT_START,
    PAD_TOKEN,
    PYTHON_END,
    PYTHON_START,
    STOP_TOKENS,
    special_token_ids,
)
from ..training.device import check_num_threads, use_cpu_threads

# a calculator call as the client reads it, GSM8K style (as inference.format_parts): <<expression=result>>
TOOL_MARKS = {PYTHON_START: "<<", PYTHON_END: "=", OUTPUT_START: "", OUTPUT_END: ">>"}
MAX_STOP_STRINGS = 4  # OpenAI's limit on `stop`
CB_SEQUENCES = 8  # continuous batching's default paged cache holds this many full-length sequences


class ChatParams(TransformersCompletionCreateParamsStreaming, total=False):
    """The request fields transformers accepts, plus ours (sent by OpenAI clients through ``extra_body``)."""

    calculator: bool
    top_k: int


@dataclass
class ServeOptions:
    """What the ``serve`` command was given (see ``cli.parse_args`` for each one's meaning)."""

    model: str
    name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    device: str | None = None
    dtype: str = "auto"
    num_threads: int | None = None
    continuous_batching: bool = False
    cb_num_blocks: int | None = None
    cb_max_batch_tokens: int | None = None
    no_calculator: bool = False
    log_level: str = "warning"


def say(line: str) -> None:
    print(f"serve: {line}", file=sys.stderr, flush=True)


def reply_text(tokenizer, tokens: list[int], marks: dict[int, str]) -> str:
    """The reply as the client reads it: text decoded run by run, a calculator call as ``<<expr=result>>``, every
    other special token (stop tokens included) left out. A prefix of the tokens gives a prefix of the text (but for
    a character whose bytes are not all there yet), so streaming sends the growth."""
    special = set(tokenizer.all_special_ids) | set(marks)
    out, run = [], []
    for t in [*tokens, None]:
        if t is not None and t not in special:
            run.append(t)
            continue
        if run:
            out.append(tokenizer.decode(run, clean_up_tokenization_spaces=False))
            run = []
        out.append(marks.get(t, ""))
    return "".join(out)


class _Stop(Exception):
    """Raised from the streamer to end generate(): a stop string was written or the client went away."""


class ReplyStream(BaseStreamer):
    """Reply tokens in (from generate() as its streamer, or from continuous batching's outputs), text deltas out on
    an asyncio queue, then one final dict: ``{"finish_reason", "completion_tokens"}`` or ``{"error": message}``.

    Stop strings: the text ends before the first one, generation is stopped there; text that may be the start of
    a stop string is held back until it cannot be."""

    def __init__(self, tokenizer, marks: dict[int, str], stops: set[int], stop_strings: list[str], loop, queue):
        self.tokenizer, self.marks, self.stops, self.stop_strings = tokenizer, marks, stops, stop_strings
        self.loop, self.queue = loop, queue
        self.tokens: list[int] = []
        self.sent = ""
        self.finished = False
        self.stopped_by_string = False
        self.cancelled = threading.Event()
        self._prompt_seen = False

    def _emit(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def put(self, value: torch.Tensor) -> None:  # generate(): the prompt first, then each new token
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.add(value.reshape(-1).tolist())
        if self.finished or self.cancelled.is_set():
            raise _Stop

    def end(self) -> None:  # generate() is done (max_new_tokens or a stop token)
        self._finish()

    def add(self, new_tokens: list[int]) -> None:
        if self.finished:
            return
        for t in new_tokens:
            self.tokens.append(t)
            if t in self.stops:
                break
        text = reply_text(self.tokenizer, self.tokens, self.marks)
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped_by_string = True
            self._send(text[:cut])
            self._finish()
            return
        if self.tokens and self.tokens[-1] in self.stops:
            self._finish()
            return
        hold = len(text) - len(text.rstrip("\ufffd"))  # an incomplete character
        for s in self.stop_strings:  # the longest end of the text that begins a stop string
            hold = max(hold, next((n for n in range(min(len(s) - 1, len(text)), 0, -1) if s.startswith(text[-n:])), 0))
        self._send(text[: len(text) - hold])

    def _send(self, text: str) -> None:
        if len(text) > len(self.sent):
            self._emit(text[len(self.sent) :])
            self.sent = text

    def _finish(self) -> None:
        if self.finished:
            return
        if not self.stopped_by_string:
            self._send(reply_text(self.tokenizer, self.tokens, self.marks))
        self.finished = True
        stop = self.stopped_by_string or (self.tokens and self.tokens[-1] in self.stops)
        self._emit({"finish_reason": "stop" if stop else "length", "completion_tokens": len(self.tokens)})

    def fail(self, message: str) -> None:
        if not self.finished:
            self.finished = True
            self._emit({"error": message})


def _bad(message: str, status: int = 400) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


def _number(body: dict, field: str, kind: type, low: float, default: Any = None) -> Any:
    """body[field] as `kind`, at least `low`; a 400 naming the field otherwise."""
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < low:
        word = "a positive integer" if kind is int else f"a number >= {low}"
        raise _bad(f"{field} must be {word}, got {json.dumps(value)}")
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
    def parse(cls, body: dict, calculator_default: bool) -> ChatRequest:
        """The request's generation settings, each checked (HTTP 400 with one line naming the field)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _bad("messages must be a non-empty list of {role, content} objects")
        max_tokens = _number(body, "max_completion_tokens", int, 1)
        if max_tokens is None:
            max_tokens = _number(body, "max_tokens", int, 1)
        if body.get("n") not in (None, 1):
            raise _bad(f"n must be 1 (one reply per request), got {json.dumps(body['n'])}")
        if body.get("top_p") not in (None, 1):
            raise _bad("top_p is not supported: nanochat samples with temperature and top_k")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)
        ):
            raise _bad(f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings")
        calculator = body.get("calculator", calculator_default)
        if not isinstance(calculator, bool):
            raise _bad(f"calculator must be true or false, got {json.dumps(calculator)}")
        return cls(
            messages=[{"role": m.get("role"), "content": m.get("content")} for m in messages],
            max_tokens=max_tokens,
            temperature=_number(body, "temperature", float, 0.0, default=0.0),
            top_k=_number(body, "top_k", int, 1),
            seed=_number(body, "seed", int, 0),
            stop=stop,
            calculator=calculator,
            stream=bool(body.get("stream")),
        )


class NanoChatModelManager(ModelManager):
    """transformers' model manager, loading the served directory with our class (transformers' own looks the
    architecture up by name in its namespace, where a remote-code model is not) and listing it under its name."""

    def __init__(self, name: str, **kwargs):
        self.name = name
        super().__init__(**kwargs)

    def _load_processor(self, model_id_and_revision: str, gguf_file: str | None = None):
        return AutoTokenizer.from_pretrained(model_id_and_revision)

    def _load_model(self, model_id_and_revision: str, **kwargs) -> NanoChatGPTForCausalLM:
        model = NanoChatGPTForCausalLM.from_pretrained(
            model_id_and_revision,
            dtype=self.dtype,
            device_map=self.device,
            attn_implementation=self.attn_implementation,
        )
        return model.eval()

    def served(self) -> tuple[NanoChatGPTForCausalLM, Any]:
        return self.load_model_and_processor(self.process_model_name(self.force_model))

    def list_models(self, cache_dir: str | None = None) -> list[dict]:
        return [{"id": self.name, "object": "model", "created": 0, "owned_by": "local", "status": {"value": "loaded"}}]


class NanoChatCompletionHandler(ChatCompletionHandler):
    """/v1/chat/completions for a nanochat model: nanochat's rendering, stop tokens and calculator tool, through
    transformers' generation thread or continuous batching manager."""

    _valid_params_class = ChatParams

    def __init__(self, *args, calculator: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.calculator = calculator

    async def handle_request(self, body: dict, request_id: str) -> StreamingResponse | JSONResponse:
        self._validate_request(body)  # transformers': unknown fields -> 422
        request = ChatRequest.parse(body, self.calculator)
        manager: NanoChatModelManager = self.model_manager
        if body.get("model") not in (None, manager.name):
            raise _bad(f"model {body['model']!r} is not served here: this server serves {manager.name!r}", 404)
        model, tokenizer = manager.served()
        try:
            prompt = render_for_completion(tokenizer, {"messages": request.messages}, max_tokens=None)
        except UserError as e:
            raise _bad(str(e)) from e
        context = model.config.sequence_len
        if len(prompt) >= context:
            raise _bad(f"the conversation is {len(prompt)} tokens, the model's context (sequence_len) is {context}")
        max_new = request.max_tokens or context - len(prompt)
        ids = special_token_ids(tokenizer)
        marks = {ids[name]: mark for name, mark in TOOL_MARKS.items()}
        stops = {ids[name] for name in STOP_TOKENS}
        queue: asyncio.Queue = asyncio.Queue()
        stream = ReplyStream(tokenizer, marks, stops, request.stop, asyncio.get_running_loop(), queue)
        use_cb = self.generation_state._continuous_batching
        if use_cb:
            cancel = self._start_batched(model, tokenizer, prompt, max_new, stops, request, stream, request_id)
        else:
            cancel = self._start_sequential(model, tokenizer, prompt, max_new, request, stream)
        usage = {"prompt_tokens": len(prompt)}
        if request.stream:
            return StreamingResponse(self._sse(queue, cancel, request_id, usage), media_type="text/event-stream")
        content, final = "", None
        while final is None:
            item = await queue.get()
            if isinstance(item, str):
                content += item
            else:
                final = item
        if "error" in final:
            raise _bad(f"generation failed: {final['error']}", 500)
        return JSONResponse(
            self._build_completion(
                request_id, content, manager.name, final["finish_reason"], usage=self._usage(usage, final)
            )
        )

    def _start_sequential(self, model, tokenizer, prompt, max_new, request: ChatRequest, stream) -> Callable:
        """generate_tokens on transformers' generation thread (one request at a time)."""

        def run() -> None:
            try:
                generate_tokens(
                    model,
                    tokenizer,
                    [prompt],
                    max_new,
                    request.temperature,
                    request.top_k,
                    request.seed,
                    streamer=stream,
                    calculator=request.calculator,
                )
            except _Stop:
                pass
            except Exception as e:  # the client gets it; the server goes on
                stream.fail(f"{type(e).__name__}: {e}")
                return
            stream.end()

        self.generation_state.get_manager(self.model_manager.name).submit(run)
        return stream.cancelled.set

    def _start_batched(self, model, tokenizer, prompt, max_new, stops, request, stream, request_id) -> Callable:
        """A request to transformers' continuous batching manager (greedy, no calculator: see `start`)."""
        if request.temperature > 0 or request.calculator:
            what = "sampling (temperature > 0)" if request.temperature > 0 else "the calculator tool"
            raise _bad(f"{what} is not available with continuous batching: send temperature 0 and calculator false")
        manager: CBGenerateManager = self.generation_state.get_manager(self.model_manager.name, use_cb=True)
        pad = special_token_ids(tokenizer)[PAD_TOKEN]
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=sorted(stops), pad_token_id=pad)
        config.use_cache = False  # the paged cache is continuous batching's own
        manager.init_cb(model, config)
        manager._check_alive(request_id)  # a dead worker: transformers' 503 (CBWorkerDeadError) at once
        cb = manager._cb

        def on_output(output) -> None:
            stream.add(output.generated_tokens[len(stream.tokens) :])
            if output.error is not None:
                stream.fail(output.error)
            elif output.is_finished():
                stream.end()
            elif stream.finished:  # a stop string
                cb.cancel_request(request_id)

        cb.register_result_handler(request_id, on_output)
        accepted = cb.add_request(
            prompt, request_id=request_id, max_new_tokens=max_new, streaming=True, eos_token_id=sorted(stops)
        )
        if accepted is None:  # the manager is stopping
            raise _bad("the server is shutting down: no new requests", 503)
        return lambda: cb.cancel_request(request_id)

    def _usage(self, usage: dict, final: dict) -> CompletionUsage:
        done = final["completion_tokens"]
        return CompletionUsage(
            prompt_tokens=usage["prompt_tokens"], completion_tokens=done, total_tokens=sum(usage.values()) + done
        )

    async def _sse(self, queue, cancel: Callable, request_id: str, usage: dict) -> AsyncGenerator[str, None]:
        name = self.model_manager.name
        try:
            yield self._build_chunk_sse(request_id, role="assistant", model=name)
            while True:
                item = await queue.get()
                if isinstance(item, str):
                    yield self._build_chunk_sse(request_id, content=item, model=name)
                elif "error" in item:
                    yield f"data: {json.dumps({'error': {'message': item['error']}})}\n\n"
                    return
                else:
                    yield self._build_chunk_sse(
                        request_id, finish_reason=item["finish_reason"], model=name, usage=self._usage(usage, item)
                    )
                    yield "data: [DONE]\n\n"
                    return
        except (GeneratorExit, asyncio.CancelledError):  # the client went away: stop generating for it
            cancel()
            raise


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error body: the official client shows error.message."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _one_line(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            return f"the request body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))})"
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg')}")
    return "; ".join(parts)


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


class Server(uvicorn.Server):
    """uvicorn's server that also stops transformers' continuous batching worker when it shuts down; ``manager``
    holds the served model."""

    def __init__(self, config: uvicorn.Config, manager: NanoChatModelManager, state: GenerationState):
        super().__init__(config)
        self.manager, self.state = manager, state

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        self.state.shutdown()


def start(options: ServeOptions) -> Server:
    """Load the model and build transformers' server around it; returns the uvicorn server (``.run()`` serves)."""
    path = Path(options.model)
    config = _check_model_dir(path)
    name = options.name or path.resolve().name
    check_num_threads(options.num_threads, f"--num-threads {options.num_threads}")
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batching = options.continuous_batching
    if batching and config.smear:
        say(
            "continuous batching off: this model's smear (nanochat G5) needs each sequence's previous token, "
            "which transformers' paged cache does not keep; serving one request at a time with generate()"
        )
        batching = False
    elif batching:
        say("continuous batching: greedy decoding only, calculator tool off (a request asking for either gets 400)")
    manager = NanoChatModelManager(
        name, device=device, dtype=options.dtype, continuous_batching=batching, force_model=str(path)
    )
    cb_config = None
    if batching:
        # transformers sizes the paged cache from free GPU memory; on a CPU that takes long and much memory:
        # room for CB_SEQUENCES full-length sequences unless told otherwise
        cb_config = ContinuousBatchingConfig(max_batch_tokens=options.cb_max_batch_tokens or config.sequence_len)
        per_sequence = math.ceil(config.sequence_len / cb_config.page_size) + 1  # num_blocks counts pages
        cb_config.num_blocks = options.cb_num_blocks or CB_SEQUENCES * per_sequence
    state = GenerationState(continuous_batching=batching, cb_config=cb_config)
    chat = NanoChatCompletionHandler(
        model_manager=manager, generation_state=state, calculator=not options.no_calculator and not batching
    )
    app = build_server(
        manager,
        chat,
        completion_handler=CompletionHandler(model_manager=manager, generation_state=state),
        response_handler=ResponseHandler(model_manager=manager, generation_state=state),
        transcription_handler=TranscriptionHandler(manager, state),
        systemone_handler=SystemOneHandler(model_manager=manager, generation_state=state),
        generation_state=state,
    )
    app.add_exception_handler(HTTPException, lambda _request, e: _error(e.status_code, str(e.detail)))
    app.add_exception_handler(RequestValidationError, lambda _request, e: _error(400, _one_line(e)))
    if device.startswith("cpu"):  # measured once, at start: requests come later, on the cores idle then
        say(use_cpu_threads(options.num_threads, flag="--num-threads"))
    say(f"http://{options.host}:{options.port}/v1 serves {name!r} ({path}) on {device}")
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level=options.log_level)
    return Server(config, manager, state)
