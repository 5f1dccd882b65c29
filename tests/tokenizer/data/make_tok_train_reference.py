"""Writes tests/tokenizer/data/tok_train_92d63d4/ by running nanochat HEAD's scripts/tok_train.py (not in the suite).

    mkdir -p /tmp/nc && git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc   # or a copy of the tree
    python tests/tokenizer/data/make_tok_train_reference.py /tmp/nc tests/tokenizer/data/tok_train_92d63d4

with this repository's venv and rustbpe 0.1.0 + tiktoken installed (nanochat's tokenizer imports both). It writes
synthetic pretraining shards (OUT/shards/shard_0000{0,1,2}.parquet: seeded random documents of words, numbers,
code, several scripts and emoji; several row groups per shard; some documents longer than DOC_CAP), puts them in
a fresh $NANOCHAT_BASE_DIR/base_data_climbmix, runs `python -m scripts.tok_train` there with ARGS, and keeps what
it wrote: OUT/tokenizer.pkl and OUT/token_bytes.pt. Then HEAD's RustBPETokenizer (from that folder) encodes the
held-out texts (the validation shard's documents, and HELDOUT): OUT/heldout.json {"args", "texts", "ids"}.

Last, HEAD's scripts/tok_eval.py on that folder and those shards, with its two baselines (tiktoken's GPT-2 and GPT-4
encodings, a download) replaced by tokenizers of HEAD's tok_train.py: "gpt2" by tests/tokenizer/data/nanochat_92d63d4
(vocab 400), "cl100k_base" by one it trains here with --vocab-size BASELINE_VOCAB (OUT/baseline/: tokenizer.pkl,
token_bytes.pt; the text runs out at 1374 tokens, which HEAD accepts). What it prints: OUT/tok_eval.txt.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB_SIZE, MAX_CHARS, DOC_CAP = 1024, 90_000, 1_500
ARGS = ["--vocab-size", str(VOCAB_SIZE), "--max-chars", str(MAX_CHARS), "--doc-cap", str(DOC_CAP)]
SHARD_DOCS = (70, 70, 12)  # two train shards, then the validation shard
ROW_GROUP = 16
BASELINE_VOCAB = 1536

WORDS = (
    "the of and to in is was for that with as on by at from his her they this which be are or an had not but "
    "what all were when we there can more if no out so said time about would up into them some could other "
    "number people water first been call who oil its now find long down day did get come made may part over "
    "sound work place year live back give most very after thing our just name good sentence man think say great "
    "where help through much before line right too mean old any same tell boy follow came want show also around "
    "form three small set put end does another well large must big even such because turn here why ask went men "
    "read need land different home us move try kind hand picture again change off play spell air away animal "
    "house point page letter mother answer found study still learn should America world tokenizer merges"
).split()
SCRIPTS = [
    "日本語のテキスト、中文文本。東京は大きい都市です。你好世界",
    "한국어 텍스트입니다. 정직한 사실 위에",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок",
    "naïve café Ångström Straße ΑΒΓ αβγ مرحبا بالعالم שלום עולם नमस्ते",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣ 🌍 ❤️‍🔥!!",
]
CODE = [
    "def add(a, b):\n    return a + b\n\nprint(add({n}, {m}))\n",
    "for (int i = 0; i < {n}; ++i) {{\n\tsum += a[i] * b[i]; // dot\n}}\n",
    '{{"key": [{n}, {m}], "nested": {{"a": null, "b": true}}}}\n',
    "x = [i ** 2 for i in range({n}) if i % {m} == 0]\n",
]
HELDOUT = [
    "Hello world! This is a test.\nNumbers: 123, 4567, 89\nContractions: I'm, you're, it's\n"
    "Special chars: @#$%^&*()\nUnicode: 你好世界 🌍",  # HEAD's tok_train.py sanity text
    "  leading spaces, trailing spaces   \n\n\n\tand tabs\r\n\r\n",
    "Numbers: 0 7 42 123 4567 1234567890 3.14159 1,000,000 2^16=65536 -12e-3 0x1F ١٢٣ ½ Ⅻ",
    "DON'T I'M YOU'RE WE'VE SHE'LL 'tis rock'n'roll o'clock",
    "words never seen: zyzzyva quixotic floccinaucinihilipilification",
]


def document(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 40)):
        kind = rng.random()
        if kind < 0.7:
            words = [rng.choice(WORDS[: rng.randint(20, len(WORDS))]) for _ in range(rng.randint(3, 18))]
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 7))))
            sentence = " ".join(words)
            parts.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ",", ";", ":"]))
        elif kind < 0.8:
            parts.append(rng.choice(SCRIPTS))
        elif kind < 0.9:
            parts.append(rng.choice(CODE).format(n=rng.randint(0, 999), m=rng.randint(1, 9)))
        else:
            parts.append(rng.choice(["\n", "\n\n", "  ", "\t", " \n "]))
    return " ".join(parts)


def write_shards(out: Path) -> list[list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(49)
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, n in enumerate(SHARD_DOCS):
        docs = [document(rng) for _ in range(n)]
        table = pa.table({"text": docs})
        pq.write_table(table, out / f"shard_{i:05d}.parquet", row_group_size=ROW_GROUP, compression="zstd")
        shards.append(docs)
    return shards


TOK_EVAL = """
import runpy, sys
from nanochat.tokenizer import RustBPETokenizer
dirs = {"gpt2": sys.argv[1], "cl100k_base": sys.argv[2]}
RustBPETokenizer.from_pretrained = classmethod(lambda cls, name: cls.from_directory(dirs[name]))
runpy.run_path("scripts/tok_eval.py", run_name="__main__")
"""

ENCODE = """
import json, sys
from nanochat.tokenizer import RustBPETokenizer
tok = RustBPETokenizer.from_directory(sys.argv[1])
texts = json.load(open(sys.argv[2]))
print(json.dumps([tok.encode(t) for t in texts]))
"""


def main(nanochat: str, out: str) -> None:
    nanochat, out = Path(nanochat).resolve(), Path(out).resolve()
    shards = write_shards(out / "shards")
    train_chars = sum(len(d[:DOC_CAP]) for s in shards[:-1] for d in s)
    assert MAX_CHARS < train_chars, f"the cap must fall inside the text ({train_chars} characters)"
    with tempfile.TemporaryDirectory() as base:
        shutil.copytree(out / "shards", Path(base) / "base_data_climbmix")
        env = {**os.environ, "NANOCHAT_BASE_DIR": base, "NANOCHAT_DTYPE": "float32", "PYTHONPATH": str(nanochat)}
        subprocess.run([sys.executable, "-m", "scripts.tok_train", *ARGS], cwd=nanochat, env=env, check=True)
        for name in ("tokenizer.pkl", "token_bytes.pt"):
            shutil.copyfile(Path(base) / "tokenizer" / name, out / name)
        texts = shards[-1] + HELDOUT
        (Path(base) / "texts.json").write_text(json.dumps(texts))
        ids = subprocess.run(
            [sys.executable, "-c", ENCODE, str(out), str(Path(base) / "texts.json")],
            cwd=nanochat,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        baseline = Path(base) / "baseline"
        shutil.copytree(out / "shards", baseline / "base_data_climbmix")
        subprocess.run(
            [sys.executable, "-m", "scripts.tok_train", "--vocab-size", str(BASELINE_VOCAB)],
            cwd=nanochat,
            env={**env, "NANOCHAT_BASE_DIR": str(baseline)},
            check=True,
        )
        (out / "baseline").mkdir(exist_ok=True)
        for name in ("tokenizer.pkl", "token_bytes.pt"):
            shutil.copyfile(baseline / "tokenizer" / name, out / "baseline" / name)
        gpt2 = Path(__file__).resolve().parent / "nanochat_92d63d4"
        table = subprocess.run(
            [sys.executable, "-c", TOK_EVAL, str(gpt2), str(out / "baseline")],
            cwd=nanochat,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (out / "tok_eval.txt").write_text(table)
    reference = {"args": ARGS, "texts": texts, "ids": json.loads(ids)}
    (out / "heldout.json").write_text(json.dumps(reference, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
