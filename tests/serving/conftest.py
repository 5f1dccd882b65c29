"""The real server (uvicorn on a free loopback port) in a thread of the test process, driven with the official openai
client: one per model and options for the whole session (``served``), or one of a test's own when the test changes
it (``serve``). What a client should read comes from outside the server: our generate()
(``inference.generate_tokens``) on a copy of the model loaded in the test, its tokens decoded by the tokenizer
(``client_text``).

Models: tiny random ones with the demo tokenizer (G0, and G5: sliding windows, value embeddings, smear, backout),
and a "wired" one (the tiny tokenizer of tests/inference) whose greedy reply calls the calculator."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoTokenizer

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data import demo_tokenizer
from nanochat_hf.inference import format_parts, generate_tokens, parts_from_tokens
from nanochat_hf.serving.cli import DEFAULTS, ServeOptions
from nanochat_hf.serving.server import start
from nanochat_hf.tokenizer import train_tokenizer
from nanochat_hf.tokenizer.chat_format import OUTPUT_END, OUTPUT_START, PYTHON_END, PYTHON_START, special_token_ids

G0 = dict(sequence_len=128, n_layer=2, n_head=2, n_kv_head=1, n_embd=64)
SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]
# G5 as tests/model/test_generations builds it, with a short window (9 keys) so that short replies cross it
G4 = dict(
    sequence_len=256,
    n_layer=3,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    pad_vocab_size_to=64,
    residual_lambdas=True,
    layer_types=SLIDING,
    sliding_window=9,
    value_embeddings=True,
    ve_gate_channels=12,
    ve_gate_scale=3.0,
    qk_scale=1.15,
    rope_theta=100000.0,
    rotary_dtype="float32",
)
G5 = dict(G4, qk_scale=1.2, smear=True, backout=True)
CONFIGS = {"g0": G0, "g4": G4, "g5": G5}


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (a fresh model's zero projections would make every reply the same token)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else 0.3))
    return model.eval()


def save_model(folder: Path, model, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """model_dir("g0" | "g4" | "g5") -> a saved tiny random model with the demo tokenizer (made once)."""
    made = {}

    def make(generation: str) -> Path:
        if generation not in made:
            tokenizer = demo_tokenizer()
            config = NanoChatGPTConfig(vocab_size=len(tokenizer), **CONFIGS[generation])
            model = randomize(NanoChatGPTForCausalLM(config))
            made[generation] = save_model(tmp_path_factory.mktemp(generation), model, tokenizer)
        return made[generation]

    return make


TOOL_TEXTS = ["hello there, how are you?", "The answer is 5.", "Let me compute 12*7+3 with the calculator."] * 5
TOOL_REPLY = [
    "<|python_start|>",
    "2",
    "+",
    "3",
    "<|python_end|>",
]  # then the tool writes <|output_start|>5<|output_end|>
AFTER_TOOL = ["<|output_end|>", " ", "o", "k", "<|assistant_end|>"]


def wired_model(
    tokenizer, chains: list[list[int]], sequence_len: int = 64, width: int = 320, logit: float | None = None
) -> NanoChatGPTForCausalLM:
    """A model whose greedy next token depends on the current one only: in each chain of token ids, each token is
    followed by the next. One-hot embeddings, blocks adding nothing (zero output projections), lm_head row next
    holds a 1 at column current (as tests/inference's wired models). The final norm makes the one-hot sqrt(width)
    long, so the next token's logit is about 12 (after the softcap), every other's 0: greedy at any temperature.
    `logit` sets it instead (2: a sampled reply strays from the chains)."""
    vocab = len(tokenizer)
    model = NanoChatGPTForCausalLM(
        NanoChatGPTConfig(vocab_size=vocab, sequence_len=sequence_len, n_layer=1, n_head=2, n_embd=width)
    )
    follows = {}
    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.eye(vocab, width))
        model.lm_head.weight.zero_()
        for chain in chains:
            for src, dst in zip(chain[:-1], chain[1:]):
                assert follows.setdefault(src, dst) == dst, f"token {src} would have two successors"
                model.lm_head.weight[dst, src] = 1.0 if logit is None else logit / width**0.5
    return model.eval()


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> Path:
    """A model whose greedy reply to anything is <|python_start|>2+3<|python_end|>, and after the tool's output
    " ok" (``wired_model``)."""
    tokenizer = train_tokenizer(TOOL_TEXTS, vocab_size=300)

    def tid(piece: str) -> int:
        if piece.startswith("<|"):
            return tokenizer.convert_tokens_to_ids(piece)
        (idx,) = tokenizer.encode(piece, add_special_tokens=False)
        return idx

    chains = [[tid(p) for p in ["<|assistant_start|>", *TOOL_REPLY]], [tid(p) for p in AFTER_TOOL]]
    return save_model(tmp_path_factory.mktemp("tool"), wired_model(tokenizer, chains), tokenizer)


CHAT_HEAD = (
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # raw sockets' requests
)


def until(condition, seconds: float = 60) -> None:
    """Wait for `condition()` to hold (a failure after `seconds`)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def client_text(tokenizer, tokens: list[int]) -> str:
    """What a client must read for these reply tokens: decoded without special tokens (stop and role tokens), or,
    when the reply calls the calculator, as ``format_parts`` writes its parts (``<<expr=result>>``)."""
    ids = special_token_ids(tokenizer)
    if {ids[n] for n in (PYTHON_START, PYTHON_END, OUTPUT_START, OUTPUT_END)} & set(tokens):
        return format_parts(parts_from_tokens(tokenizer, tokens))
    return tokenizer.decode(tokens, skip_special_tokens=True)


class Running:
    """A started server: its openai client, its model name, and the same model and tokenizer loaded again in the
    test (for references)."""

    def __init__(self, folder: Path, **options):
        self.server = start(ServeOptions(model=str(folder), port=0, **options))
        self.port = self.server.port  # the free port the system gave it
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=120)
        self.folder, self.name = folder, folder.name
        self.model = NanoChatGPTForCausalLM.from_pretrained(folder).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not stop"

    def reference(self, messages: list[dict], max_tokens: int, calculator: bool = True, **sampling) -> str:
        """What our generate() writes for these messages, rendered by the chat template, as the client reads it."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        (tokens,) = generate_tokens(self.model, self.tokenizer, [prompt], max_tokens, calculator=calculator, **sampling)
        return client_text(self.tokenizer, tokens)


@pytest.fixture(scope="session")
def served():
    """served(folder, **ServeOptions fields) -> the Running server for this folder and these options, started once
    and shared by every test and module that asks for the same (a server with the model in its own process, the
    default, starts a fresh interpreter that imports torch: seconds). Tests on a shared server leave it as they found
    it; one that patches or breaks its server takes one of its own from ``serve``."""
    running: dict[tuple, Running] = {}

    def get(folder: Path, **options) -> Running:
        given = {name: value for name, value in options.items() if value != DEFAULTS[name]}  # a default said or not
        key = (str(folder), tuple(sorted((name, repr(value)) for name, value in given.items())))
        if key not in running:
            running[key] = Running(folder, **options)
        return running[key]

    yield get
    for server in running.values():
        server.stop()


@pytest.fixture(scope="module")
def serve():
    """serve(folder, **ServeOptions fields) -> a Running server of the module's own, stopped at the end of the
    module."""
    running = []

    def run(folder: Path, **options) -> Running:
        running.append(Running(folder, **options))
        return running[-1]

    yield run
    for server in running:
        server.stop()
