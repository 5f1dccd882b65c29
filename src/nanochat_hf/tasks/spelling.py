"""The spelling tasks (docs/nanochat.md, section 4), generated from seeds (`common.row_seed`), so that any row can be
produced alone and every machine produces the same rows. ``words`` names the word list (data/words.py: "full", the
default, or the offline demo's small "demo" list).

- SimpleSpelling: "Spell the word: w" -> "w:w,o,r,d" (training only).
- SpellingBee: count a letter in a word, spelled out and checked with the calculator; ends in ``#### N`` and is
  evaluated as GSM8K is (256 test seeds), besides being trained.
"""

from __future__ import annotations

import random
import string

from ..data.words import shuffled_word_list, word_list
from .common import Problem, Task, row_seed
from .gsm8k import check_final_number, final_number_problem


def simple_spelling(index: int, split: str, words: str = "full") -> dict:
    rng = random.Random(row_seed(index, split))
    word = rng.choice(shuffled_word_list(words))  # the list shuffled once with seed 42, as nanochat
    return {
        "messages": [
            {"role": "user", "content": f"Spell the word: {word}"},
            {"role": "assistant", "content": f"{word}:{','.join(word)}"},
        ]
    }


# "How many <letter> in <word>" in several phrasings and languages ({l} = letter, {w} = word).
_BEE_PROMPTS = (
    "How many {l} are in the word {w}?",
    "How many times does the letter {l} appear in {w}?",
    "how many {l} in {w}",
    "Count the letter {l} in the word {w}.",
    "In the word {w}, how many times do you see {l}?",
    "What is the number of {l}'s in {w}?",
    "Tell me how often {l} occurs in {w}.",
    "Can you count how many {l} there are in {w}?",
    "{w}: how many {l}?",
    "Number of {l} in {w}?",
    "¿Cuántas veces aparece la letra {l} en la palabra {w}?",
    "¿Cuántas {l} tiene {w}?",
    "Combien de fois la lettre {l} apparaît-elle dans le mot {w} ?",
    "Combien de {l} dans {w} ?",
    "Wie oft kommt der Buchstabe {l} im Wort {w} vor?",
    "Wie viele {l} hat {w}?",
    "Quante volte compare la lettera {l} nella parola {w}?",
    "Quantas vezes a letra {l} aparece na palavra {w}?",
    "Hoe vaak komt de letter {l} voor in het woord {w}?",
    "Сколько раз буква {l} встречается в слове {w}?",
    "单词{w}里有几个字母{l}？",
    "{w}という単語に{l}は何文字ありますか？",
    "{w}라는 단어에 {l}가 몇 번 나오나요?",
    "{w} kelimesinde kaç tane {l} harfi var?",
)


def spelling_bee(index: int, split: str, words: str = "full") -> dict:
    rng = random.Random(row_seed(index, split))
    word = rng.choice(word_list(words))
    letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(string.ascii_lowercase)
    count = word.count(letter)
    template = rng.choice(_BEE_PROMPTS)
    quote = rng.choice(("", "", "'", '"'))
    prompt = template.format(l=f"{quote}{letter}{quote}", w=f"{quote}{word}{quote}")
    if rng.random() < 0.3:
        prompt = prompt.lower()
    lines, hits = [], 0
    for i, ch in enumerate(word, 1):
        if ch == letter:
            hits += 1
            lines.append(f"{i}:{ch} hit! count={hits}")
        else:
            lines.append(f"{i}:{ch}")
    manual = (
        f"I need the number of times '{letter}' occurs in '{word}'. Spelling the word first:\n"
        f"{word}:{','.join(word)}\n\n"
        f"Going through the letters one at a time and counting each '{letter}':\n"
        + "\n".join(lines)
        + f"\n\nThat makes {count}.\n\nA second check with Python:\n\n"
    )
    return {
        "messages": [
            {"role": "user", "content": prompt},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": manual},
                    {"type": "python", "text": f"'{word}'.count('{letter}')"},
                    {"type": "python_output", "text": str(count)},
                    {"type": "text", "text": f"\n\nPython agrees: {count}.\n\nMy final answer is:\n\n#### {count}"},
                ],
            },
        ]
    }


def spelling_bee_problem(index: int) -> Problem:
    return final_number_problem(spelling_bee(index, "test"))


SIMPLE_SPELLING = Task("SimpleSpelling", "synthetic", key="simple_spelling", conversation=simple_spelling, words=True)
SPELLING_BEE = Task(
    "SpellingBee",
    "synthetic",
    key="spelling_bee",
    conversation=spelling_bee,
    words=True,
    mode="generative",
    problem=spelling_bee_problem,
    check=check_final_number,
    eval_size=256,  # as nanochat's chat_eval
)
