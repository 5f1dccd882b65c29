"""English word lists for the spelling tasks, shipped by the `english-words` package (no download).

``full`` (the default, what nanochat's tasks use): the package's `web2` list (Webster's Second International,
~235K entries), lower-cased, keeping only words made of the letters a-z, sorted so that `words[i]` is the same
on every machine. nanochat draws from dwyl's `words_alpha.txt` (~370K words); the task logic is the same, the
exact words drawn for a given seed differ.

``demo``: 256 short words for the offline demo, where a tiny model trained for a few minutes sees each `full`
word about once and cannot spell unseen ones. The words of 3-7 letters found in both `web2` and the package's
`gcide` dictionary (fewer rare forms), 255 of them drawn with a fixed seed, plus "apple" (the default sample
prompt's word); sorted. Train and held-out rows (different seeds) draw from the same list, as nanochat's
train and test rows share one list.

SimpleSpelling draws from a copy shuffled once with ``random.Random(42)`` (`shuffled_word_list`), SpellingBee
from the list as read, as nanochat's two tasks do.

Select a list per task in a mixture YAML with ``words: demo`` (simple_spelling and spelling_bee only).
"""

from __future__ import annotations

import functools
import random
import re

from english_words import get_english_words_set

from ..errors import UserError

DEMO_WORDS_SIZE = 256


@functools.lru_cache(maxsize=1)
def english_words() -> tuple[str, ...]:
    words = get_english_words_set(["web2"], lower=True)
    return tuple(sorted(w for w in words if re.fullmatch(r"[a-z]+", w)))


@functools.lru_cache(maxsize=1)
def demo_words() -> tuple[str, ...]:
    gcide = get_english_words_set(["gcide"], lower=True)
    pool = [w for w in english_words() if 3 <= len(w) <= 7 and w in gcide and w != "apple"]
    return tuple(sorted(random.Random(0).sample(pool, DEMO_WORDS_SIZE - 1) + ["apple"]))


WORD_LISTS = {"full": english_words, "demo": demo_words}


def word_list(name: str = "full") -> tuple[str, ...]:
    """The word list called `name` (see the module docstring); UserError for an unknown name."""
    if name not in WORD_LISTS:
        raise UserError(f"unknown word list {name!r} (expected one of: {', '.join(WORD_LISTS)})")
    return WORD_LISTS[name]()


@functools.lru_cache(maxsize=None)
def shuffled_word_list(name: str = "full") -> tuple[str, ...]:
    """A copy of `word_list(name)` shuffled once with `random.Random(42).shuffle`: SimpleSpelling's word order
    (SpellingBee draws from the list as read)."""
    words = list(word_list(name))
    random.Random(42).shuffle(words)
    return tuple(words)
