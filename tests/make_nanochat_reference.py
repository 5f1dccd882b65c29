"""Writes the nanochat reference data of the tests by running nanochat's own code (not part of the suite).

Run it inside a nanochat tree at a commit, with this repository's venv and rustbpe (``pip install rustbpe``, used
by nanochat's tokenizer) importable, on CPU:

    git -C <nanochat.git> archive <commit> | tar -x -C /tmp/nc_<commit>
    cd /tmp/nc_<commit> && NANOCHAT_DTYPE=float32 python <this file> <part> <arguments>

parts:
  tokenizer OUT_DIR      scripts/tok_train.py on CORPUS (vocab 400), its data loader replaced by CORPUS:
                         OUT_DIR/tokenizer/{tokenizer.pkl,token_bytes.pt}
  calculator OUT.json    nanochat.engine.use_calculator on EXPRESSIONS; what the engine forces: str(result)
  gsm8k TOK_DIR OUT_DIR  tasks/gsm8k.py on GSM8K_ROWS (hub layout, loaded from json and shuffled with seed 42 as
                         the task does) and COMPLETIONS (tokens as the engine returns them, terminal token left
                         out), decoded with tokenizer.decode and scored with GSM8K.evaluate, as chat_eval does
  render TOK_DIR OUT.json  tokenizer.render_conversation (ids, mask) of CONVERSATIONS
  engine TOK_DIR OUT.json  nanochat.engine.Engine.generate_batch (greedy, the calculator tool on) on the prompt
                         render_for_completion gives for ENGINE_CASES, with a "wired" model whose next token is a
                         fixed function of the current one (each chain's token i leads to token i+1; any other
                         token to id 0): the tokens it returns after the prompt (terminal token left out)
"""

from __future__ import annotations

import itertools
import json
import os
import runpy
import sys
from pathlib import Path

CORPUS = [
    "Hello world! This is a test. Numbers: 123, 4567, 89. Contractions: I'm, you're, it's.",
    "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.\n#### 10",
    "日本語のテキスト、中文文本。한국어 텍스트입니다. 東京は大きい都市です。你好世界",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣ 🌍 ❤️‍🔥!!",
    "Accents: naïve café Ångström Straße ΑΒΓ αβγ Привет, мир! مرحبا بالعالم שלום עולם नमस्ते",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "How many r are in strawberry? Let me count: 'strawberry'.count('r') gives 3.",
] * 30

EXPRESSIONS = [
    "12*7+3",
    "2+3",
    " (1 + 2) * -3 ",
    "5/2",
    "10/2",
    "12/60",
    "0.2*50",
    "0.1+0.2",
    "1/3",
    "2/3*3",
    "7//2",
    "100*1.1",
    "3.0",
    "-0.0",
    "--5",
    "+4",
    "4,56*2",
    "1,234.5/2",
    "99999999999*99999999999",
    "9999999999.0*" * 40 + "1.0",
    ".5+5.",
    "3**2",
    "2 ** 3",
    "7%3",
    "1e3",
    "1.5e3",
    "1_000",
    "x*2",
    "$5+3",
    "5+3=",
    "12 * 3\n",
    "1/0",
    "1//0",
    "1 +",
    "",
    "()",
    "()*3",
    "...",
    "(1)(2)",
    "012",
    "1.5.2",
    "(" * 300 + "1" + ")" * 300,
    "'strawberry'.count('r')",
    '"banana".count("an")',
    "'a,b,c'.count(',')",
    "'x'.count('')",
    "'Banana'.upper().count('A')",
    "'a b a'.split().count('a')",
    "'abc'.count('z') or 'none'",
    "'abc'.count('a') if 0 else 7",
    "not 'abc'.count('a')",
    "'abc'.find('c')",
    "'abc'.upper()",
    "__import__('os').count('a')",
    "open('f').count('a')",
    "'abc'.count(x)",
    "abs('a'.count('a'))",
    "'abc'.count('a') + 1",
    "'a'.count('a') * 3",
]

GSM8K_ROWS = [
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
        "$<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "A shop sold 1,000 pens on Monday and 234 on Tuesday. How many pens did it sell?",
        "answer": "It sold 1,000 + 234 = <<1000+234=1234>>1,234 pens.\n#### 1,234",
    },
    {
        "question": "The temperature was 4 degrees and fell by 7. What is it now?",
        "answer": "4 - 7 = <<4-7=-3>>-3\n#### -3",
    },
    {
        "question": "Tom has 2 apples and buys 3 more. How many apples does he have?",
        "answer": "2 + 3 = <<2+3=5>>5\n#### 5",
    },
    {
        "question": "A rope of 7.5 m is cut in half. How long is each piece?",
        "answer": "7.5 / 2 = <<7.5/2=3.75>>3.75\n#### 3.75",
    },
]

# (question's first words, assistant parts of the completion); "<end>" last: the engine stopped at a terminal
COMPLETIONS = [
    (
        "Weng",
        [
            ("text", "Weng earns 12/60 = $"),
            ("python", "12/60"),
            ("python_output", "0.2"),
            ("text", "0.2 per minute, so 0.2 x 50 = $"),
            ("python", "0.2*50"),
            ("python_output", "10.0"),
            ("text", "10.\n#### 10"),
            "<end>",
        ],
    ),
    ("Weng", [("text", "#### 10 first, then a second answer\n#### 11"), "<end>"]),
    ("Weng", [("text", "She earned 10.\n#### 10."), "<end>"]),
    ("Weng", [("text", "Let me check "), ("python", "#### 9"), ("text", " so\n#### 10"), "<end>"]),
    ("Weng", [("text", "The tool says "), ("python_output", "#### 10"), ("text", " and\n#### 12"), "<end>"]),
    (
        "A shop",
        [
            ("text", "1,000 + 234 = "),
            ("python", "1,000+234"),
            ("python_output", "1234"),
            ("text", "1,234 pens 🖊️.\n#### 1,234"),
            "<end>",
        ],
    ),
    ("A shop", [("text", "#### 1234"), "<end>"]),
    ("A shop", [("text", "#### 1,234,"), "<end>"]),
    ("The temperature", [("text", "4 - 7 = -3 degrees ❄️\n#### -3"), "<end>"]),
    ("The temperature", [("text", "####-3"), "<end>"]),
    ("The temperature", [("text", "#### − 3 (unicode minus)\n#### -3"), "<end>"]),
    ("Tom", [("text", "2 + 3 = 5\n#### 5"), "<end>"]),
    ("Tom", [("text", "He has 5 apples"), "<end>"]),
    ("Tom", [("text", "He has\n#### 5"), ("python", "2+3")]),  # no terminal token: cut by max_tokens
    ("Tom", [("text", "#### $5"), "<end>"]),
    ("Tom", [("text", "#### 5.0"), "<end>"]),
    (
        "A rope",
        [
            ("text", "7.5 / 2 = "),
            ("python", "7.5/2"),
            ("python_output", "3.75"),
            ("text", "3.75 m — café.\n#### 3.75"),
            "<end>",
        ],
    ),
    ("A rope", [("text", "Each piece is 3.75 m.\n#### 3.75 m.\n#### 4"), "<end>"]),
]

CONVERSATIONS = [
    {
        "messages": [
            {"role": "user", "content": "你好，世界？"},
            {"role": "assistant", "content": "你好！🌍 很高兴见到你。"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Emoji?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Sure 👨‍👩‍👧‍👦"}]},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "Réponds en français."},
            {"role": "user", "content": "Ça va ?"},
            {"role": "assistant", "content": "Très bien, merci — naïve café Ångström ❤️‍🔥"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "How many r in strawberry?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me count 🍓: "},
                    {"type": "python", "text": "'strawberry'.count('r')"},
                    {"type": "python_output", "text": "3"},
                    {"type": "text", "text": "\n\nThere are 3 — 三.\n\n#### 3"},
                ],
            },
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "12*34?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Computing 😀"},
                    {"type": "python_output", "text": "408"},
                    {"type": "text", "text": "日本"},
                    {"type": "python", "text": "12*34"},
                    {"type": "python_output", "text": "408 ✓"},
                    {"type": "python", "text": "'é'.count('é')"},
                    {"type": "text", "text": "Ελλάδα 🇬🇷"},
                ],
            },
            {"role": "user", "content": "Merci 🙏"},
            {"role": "assistant", "content": "De rien 😊"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Empty parts"},
            {
                "role": "assistant",
                "content": [
                    {"type": "python", "text": ""},
                    {"type": "python_output", "text": ""},
                    {"type": "text", "text": ""},
                    {"type": "python_output", "text": "🙂"},
                ],
            },
        ]
    },
]


# (user message, chains of pieces: a special token or text, max_tokens). A chain's tokens must not repeat.
ENGINE_CASES = [
    (
        "What is 10/2?",
        [
            ["<|assistant_start|>", "<|python_start|>", "10/2", "<|python_end|>"],
            ["<|output_end|>", "ok", "<|assistant_end|>"],
        ],
        24,
    ),
    (
        "What is 1/3?",
        [
            ["<|assistant_start|>", "<|python_start|>", "1/3", "<|python_end|>"],
            ["<|output_end|>", "so", "<|assistant_end|>"],
        ],
        40,
    ),
    ("Budget", [["<|assistant_start|>", "<|python_start|>", "1/3", "<|python_end|>"]], 9),  # cut inside the output
    ("7%2?", [["<|assistant_start|>", "<|python_start|>", "7%2", "<|python_end|>", "no", "<|assistant_end|>"]], 16),
    (
        "Commas",
        [
            ["<|assistant_start|>", "<|python_start|>", "4,56*2", "<|python_end|>"],
            ["<|output_end|>", "ok", "<|assistant_end|>"],
        ],
        24,
    ),
    (
        "Count",
        [
            ["<|assistant_start|>", "<|python_start|>", "'strawberry'.count('r')", "<|python_end|>"],
            ["<|output_end|>", "ok", "<|assistant_end|>"],
        ],
        32,
    ),
    ("Empty", [["<|assistant_start|>", "<|python_start|>", "<|python_end|>", "ok", "<|assistant_end|>"]], 16),
    (
        "Two calls",
        [["<|assistant_start|>", "<|python_start|>", "2*3", "<|python_end|>"], ["<|output_end|>", "<|python_start|>"]],
        40,
    ),  # calls again and again until the budget ends
]


def tokenizer_part(out_dir: str) -> None:
    import nanochat.dataset

    def batches(split="train", **_):
        for i in range(0, len(CORPUS), 10):
            yield CORPUS[i : i + 10]

    nanochat.dataset.parquets_iter_batched = batches
    os.environ["NANOCHAT_BASE_DIR"] = out_dir
    spelling = "--vocab_size" if "--vocab_size" in Path("scripts/tok_train.py").read_text() else "--vocab-size"
    sys.argv = ["tok_train.py", spelling, "400"]  # the flag was --vocab_size until argparse names changed
    runpy.run_path("scripts/tok_train.py", run_name="__main__")


def calculator_part(out: str) -> None:
    from nanochat.engine import use_calculator

    cases = []
    for expr in EXPRESSIONS:
        result = use_calculator(expr)
        cases.append([expr, None if result is None else str(result)])  # the engine forces str(result)
    Path(out).write_text(json.dumps(cases, ensure_ascii=False, indent=0) + "\n")


def _nanochat_tokenizer(tok_dir: str):
    from nanochat.tokenizer import RustBPETokenizer

    return RustBPETokenizer.from_directory(tok_dir)


def gsm8k_part(tok_dir: str, out_dir: str) -> None:
    from datasets import load_dataset
    from tasks.common import Task
    from tasks.gsm8k import GSM8K

    tok = _nanochat_tokenizer(tok_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = out / "nanochat_gsm8k_rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    task = GSM8K.__new__(GSM8K)  # as GSM8K("main", "test") with the hub download replaced by the local rows
    Task.__init__(task)
    task.ds = load_dataset("json", data_files=str(rows), split="train").shuffle(seed=42)
    questions = [task[i]["messages"][0]["content"] for i in range(len(task))]
    special = {
        "python": ("<|python_start|>", "<|python_end|>"),
        "python_output": ("<|output_start|>", "<|output_end|>"),
    }
    cases = []
    for start, parts in COMPLETIONS:
        index = next(i for i, q in enumerate(questions) if q.startswith(start))
        tokens = []
        for part in parts:
            if part == "<end>":
                continue  # generate_batch leaves the terminal token out of what chat_eval decodes
            kind, text = part
            ids = tok.encode(text)
            if kind != "text":
                ids = [tok.encode_special(special[kind][0]), *ids, tok.encode_special(special[kind][1])]
            tokens += ids
        completion = tok.decode(tokens)
        cases.append(
            {
                "problem": index,
                "tokens": tokens,
                "stopped": parts[-1] == "<end>",
                "completion": completion,
                "correct": task.evaluate(task[index], completion),
            }
        )
    (out / "nanochat_gsm8k_completions.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")


def render_part(tok_dir: str, out: str) -> None:
    tok = _nanochat_tokenizer(tok_dir)
    rendered = []
    for conversation in CONVERSATIONS:
        ids, mask = tok.render_conversation(conversation)
        rendered.append({"conversation": conversation, "ids": ids, "mask": mask})
    Path(out).write_text(json.dumps(rendered, ensure_ascii=False) + "\n")


def engine_part(tok_dir: str, out: str) -> None:
    from types import SimpleNamespace

    import torch
    from nanochat.engine import Engine

    tok = _nanochat_tokenizer(tok_dir)
    vocab = tok.get_vocab_size()

    class Wired(torch.nn.Module):
        def __init__(self, pairs):
            super().__init__()
            self.config = SimpleNamespace(n_kv_head=1, n_head=1, n_embd=4, n_layer=1, sequence_len=256)
            self.table = torch.zeros(vocab, vocab)
            for src, dst in pairs:
                self.table[src, dst] = 1.0

        def get_device(self):
            return torch.device("cpu")

        def forward(self, ids, kv_cache=None):
            batch, time = ids.shape  # keep the cache's position as nanochat's GPT does (its API changed)
            if hasattr(kv_cache, "insert_kv"):
                kv_cache.insert_kv(0, torch.zeros(batch, 1, time, 4), torch.zeros(batch, 1, time, 4))
            elif kv_cache is not None:
                kv_cache.advance(time)
            return self.table[ids]

    cases = []
    for user, chains, max_tokens in ENGINE_CASES:
        chains = [
            [i for p in chain for i in ([tok.encode_special(p)] if p.startswith("<|") else tok.encode(p))]
            for chain in chains
        ]
        pairs = [(a, b) for chain in chains for a, b in itertools.pairwise(chain)]
        assert len({a for a, _ in pairs}) == len(pairs), f"{user}: a token leads to two others"
        conversation = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": ""}]}
        prompt = tok.render_for_completion(conversation)
        results, _ = Engine(Wired(pairs), tok).generate_batch(
            prompt, num_samples=1, max_tokens=max_tokens, temperature=0.0
        )
        cases.append(
            {
                "user": user,
                "chains": chains,
                "max_tokens": max_tokens,
                "prompt": prompt,
                "tokens": results[0][len(prompt) :],
                "decoded": tok.decode(results[0][len(prompt) :]),
            }
        )
    Path(out).write_text(json.dumps(cases, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    part, *args = sys.argv[1:]
    {
        "tokenizer": tokenizer_part,
        "calculator": calculator_part,
        "gsm8k": gsm8k_part,
        "render": render_part,
        "engine": engine_part,
    }[part](*args)
