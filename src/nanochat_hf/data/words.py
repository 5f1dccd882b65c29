"""English word list for the spelling tasks, shipped by the `english-words` package (no download).

We use the package's `web2` list (Webster's Second International, ~235K entries), lower-cased, keeping
only words made of the letters a-z, sorted so that `words[i]` is the same on every machine.
nanochat draws from dwyl's `words_alpha.txt` (~370K words); the task logic is the same, the exact words
drawn for a given seed differ.
"""

from __future__ import annotations

import functools
import re

WORD_LIST_NAME = "english-words:web2 (lower-case, a-z only, sorted)"


@functools.lru_cache(maxsize=1)
def english_words() -> tuple[str, ...]:
    from english_words import get_english_words_set

    words = get_english_words_set(["web2"], lower=True)
    return tuple(sorted(w for w in words if re.fullmatch(r"[a-z]+", w)))
