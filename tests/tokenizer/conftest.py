"""Shared fixtures: a varied text sample, a tokenizer trained on it, and a nanochat-style tiktoken directory."""

import collections
import pickle
import random

import pytest
import regex

from nanochat_hf.tokenizer import SPECIAL_TOKENS, SPLIT_PATTERN, train_tokenizer

SAMPLES = [
    "Hello, world! It's a test; we'll see -- they're 'quoted' & DON'T I'M YOU'RE WE'VE SHE'LL.",
    "Numbers: 0 7 42 123 4567 1234567890 3.14159 1,000,000 2^16=65536 -12e-3 0x1F ١٢٣ ۴۵۶ ½ Ⅻ",
    "Whitespace  runs   and\ttabs\t\tand\n\nnewlines\n\n\n   indented\n  \r\n\r\n trailing   \n\u00a0nbsp\u3000ideo ",
    "日本語のテキスト、中文文本。한국어 텍스트입니다. 東京は大きい都市です。",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣ zwj ❤️‍🔥!!",
    "Accents: naïve café Ångström Straße ΑΒΓ αβγ Привет, мир! مرحبا بالعالم שלום עולם नमस्ते",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "print([fib(i) for i in range(10)])\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i]; // dot\n}\n#include <stdio.h>\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}\n<div class="x">&amp;</div>',
    "Punctuation!!! ??? ... --- *** ''' \"\"\" ((( ))) [[[ ]]] @@@ ### $$$ %%% ^^^ ~~~ ``` |||",
    "Mixed: abc123def 3rd 21st CO2 H2O x86_64 i18n l10n v1.2.3-rc.4 user@example.com https://a.b/c?d=e&f=g",
    "   leading spaces and trailing spaces   ",
    "\n\n\nOnly newlines at the start",
    "Contractions: don't can't won't shan't y'all 'tis o'clock rock'n'roll",
]


def random_text(rng: random.Random, n: int) -> str:
    """Random characters from many scripts, digits, spaces, controls and symbols."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r\x0b\x0c\u00a0\u2003\u3000",
        "'\"!?.,;:-_()[]{}<>/\\|@#$%^&*+=~`",
        "éèêëàâäôöûüçñßøåÆŒ",
        "αβγδεζηθικλμνξοπρστυφχψω",
        "абвгдежзийклмнопрстуфхцчшщъыьэюя",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
        "ひらがなカタカナ한글",
        "😀😂🥲👍🏽🇫🇷❤️\u200d",
        "٠١٢٣٤٥٦٧٨٩",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def fuzz_texts(seed: int = 0, count: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [random_text(rng, rng.randint(1, 80)) for _ in range(count)]


@pytest.fixture(scope="session")
def samples() -> list[str]:
    return list(SAMPLES)


@pytest.fixture(scope="session")
def fuzz():
    """fuzz(seed, count) -> random varied strings."""
    return fuzz_texts


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    rng = random.Random(1)
    return (
        SAMPLES * 20 + fuzz_texts(seed=1, count=200) + [" ".join(rng.choice(SAMPLES).split()[:8]) for _ in range(200)]
    )


@pytest.fixture(scope="session")
def tok(corpus):
    return train_tokenizer(corpus, 1024)


def hand_bpe_ranks(texts: list[str], n_merges: int) -> dict[bytes, int]:
    """A tiny independent byte-level BPE (as nanochat's rustbpe): bytes 0..255 in byte order, then merges."""
    chunks = collections.Counter(c for t in texts for c in regex.findall(SPLIT_PATTERN, t))
    words = [[bytes([b]) for b in c.encode("utf-8")] for c in chunks]
    counts = list(chunks.values())
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, n in zip(words, counts):
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], -ranks[kv[0][0]], -ranks[kv[0][1]]))
        ranks[a + b] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i : i + 2] = [a + b]
                i += 1
    return ranks


@pytest.fixture(scope="session")
def tiktoken_encoding(corpus):
    """A tiktoken.Encoding laid out as tok_train.py's: ids 0-255 are the 256 single bytes (0x80-0xFF included), then
    merges hand-trained on the Unicode-heavy corpus, then the nine specials."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = hand_bpe_ranks(corpus, 300)
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="test", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture()
def nanochat_tokenizer_dir(tmp_path, tiktoken_encoding):
    """nanochat's on-disk layout: tokenizer.pkl (pickled Encoding) + token_bytes.pt (int32, 0 for specials)."""
    import torch

    d = tmp_path / "tokenizer"
    d.mkdir()
    with open(d / "tokenizer.pkl", "wb") as f:
        pickle.dump(tiktoken_encoding, f)
    # as tok_train.py: UTF-8 length of each token's decoded string (tiktoken's decode replaces invalid UTF-8 with
    # U+FFFD: a lone byte 0x80-0xFF counts 3), 0 for the specials
    special_ids = set(tiktoken_encoding._special_tokens.values())
    sizes = [
        0 if i in special_ids else len(tiktoken_encoding.decode([i]).encode("utf-8"))
        for i in range(tiktoken_encoding.n_vocab)
    ]
    torch.save(torch.tensor(sizes, dtype=torch.int32), d / "token_bytes.pt")
    return d
