"""The offline demo's own tasks, generated from seeds (`common.row_seed`): arithmetic word problems in GSM8K's row
format (question, answer with ``<<expr=result>>`` calculator annotations and ``#### N``) and multiple-choice
questions in MMLU's row format (question, choices, answer), converted to conversations by GSM8K's and MMLU's own
code; and the shipped identity conversations (identity.py)."""

from __future__ import annotations

import random
import string

from ..data.words import english_words
from . import gsm8k, mmlu
from .common import Task, row_seed

# ---------------------------------------------------------------- arithmetic word problems (GSM8K rows)

_NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Isla",
    "Jon",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
    "Uma",
    "Vera",
    "Wen",
    "Yusuf",
)
_ITEMS = ("apples", "stickers", "marbles", "pencils", "cookies", "stamps", "shells", "books", "cards", "eggs")


def _calc(expr: str, value: int) -> str:
    return f"{expr} = <<{expr}={value}>>{value}"


def arithmetic_row(index: int, split: str) -> dict:
    """One GSM8K-style row {question, answer} with calculator annotations."""
    rng = random.Random(row_seed(index, split))
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b, c = rng.randint(2, 60), rng.randint(2, 9), rng.randint(2, 12)
        q = (
            f"{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each pack. "
            f"How many {item} does {name} have now?"
        )
        steps = [
            f"The packs hold {_calc(f'{b}*{c}', b * c)} {item}.",
            f"{name} now has {_calc(f'{a}+{b * c}', a + b * c)} {item}.",
        ]
        result = a + b * c
    elif kind == 1:
        price, n = rng.randint(2, 20), rng.randint(2, 8)
        bill = rng.choice([x for x in (50, 100, 200) if x > price * n])
        q = (
            f"A shop sells notebooks for ${price} each. {name} buys {n} notebooks and pays with a "
            f"${bill} bill. How much change does {name} get?"
        )
        steps = [
            f"The notebooks cost {_calc(f'{n}*{price}', n * price)} dollars.",
            f"The change is {_calc(f'{bill}-{n * price}', bill - n * price)} dollars.",
        ]
        result = bill - n * price
    elif kind == 2:
        per_day, days, extra = rng.randint(5, 40), rng.randint(2, 9), rng.randint(1, 30)
        q = (
            f"{name} reads {per_day} pages a day for {days} days and then {extra} pages on the last day. "
            f"How many pages does {name} read in total?"
        )
        steps = [
            f"In {days} days {name} reads {_calc(f'{per_day}*{days}', per_day * days)} pages.",
            f"In total that is {_calc(f'{per_day * days}+{extra}', per_day * days + extra)} pages.",
        ]
        result = per_day * days + extra
    elif kind == 3:
        friends, each = rng.randint(2, 9), rng.randint(2, 15)
        total = friends * each
        q = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
        steps = [f"Each friend gets {_calc(f'{total}/{friends}', each)} {item}."]
        result = each
    else:
        rows, per_row = rng.randint(3, 20), rng.randint(4, 15)
        taken = rng.randint(1, rows * per_row - 1)
        q = f"A hall has {rows} rows of {per_row} chairs. {taken} chairs are taken. How many chairs are free?"
        steps = [
            f"The hall has {_calc(f'{rows}*{per_row}', rows * per_row)} chairs.",
            f"Free chairs: {_calc(f'{rows * per_row}-{taken}', rows * per_row - taken)}.",
        ]
        result = rows * per_row - taken
    return {"question": q, "answer": "\n".join(steps) + f"\n#### {result}"}


# ---------------------------------------------------------------- multiple choice (MMLU rows)

_CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Canada": "Ottawa",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Greece": "Athens",
    "India": "New Delhi",
    "Chile": "Santiago",
    "Poland": "Warsaw",
    "Portugal": "Lisbon",
    "Australia": "Canberra",
    "Ireland": "Dublin",
    "Austria": "Vienna",
}
_KINDS = {
    "fruit": ("apple", "banana", "cherry", "grape", "mango", "pear", "plum", "peach"),
    "animal": ("horse", "tiger", "rabbit", "eagle", "whale", "mouse", "zebra", "camel"),
    "color": ("red", "blue", "green", "yellow", "purple", "orange", "black", "white"),
    "tool": ("hammer", "wrench", "saw", "drill", "chisel", "pliers", "shovel", "rake"),
}


def _numbers_around(rng: random.Random, answer: int, spread: int) -> list[int]:
    choices = {answer}
    while len(choices) < 4:
        choices.add(max(0, answer + rng.randint(-spread, spread)))
    return list(choices)


def multiple_choice_row(index: int, split: str) -> dict:
    """One MMLU-style row {question, choices (4), answer (index)}."""
    rng = random.Random(row_seed(index, split))
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-*")
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        question, correct = f"What is {a} {op} {b}?", str(answer)
        choices = (
            [str(x) for x in _numbers_around(rng, answer, 12)]
            if op != "-"
            else [str(x) for x in {answer, answer + 1, answer - 2, answer + 10}]
        )
    elif kind == 1:
        i = rng.randrange(25)
        letter = string.ascii_lowercase[i]
        correct = string.ascii_lowercase[i + 1]
        question = f"Which letter comes right after '{letter}' in the alphabet?"
        choices = [correct] + rng.sample([c for c in string.ascii_lowercase if c != correct], 3)
    elif kind == 2:
        word = rng.choice([w for w in rng.sample(english_words(), 50) if 3 <= len(w) <= 12] or ["example"])
        correct = str(len(word))
        question = f"How many letters are in the word '{word}'?"
        choices = [str(x) for x in _numbers_around(rng, len(word), 3) if x > 0]
        while len(choices) < 4:
            choices.append(str(len(word) + len(choices) + 3))
    elif kind == 3:
        country = rng.choice(sorted(_CAPITALS))
        correct = _CAPITALS[country]
        question = f"What is the capital of {country}?"
        choices = [correct] + rng.sample([c for k, c in sorted(_CAPITALS.items()) if k != country], 3)
    elif kind == 4:
        category = rng.choice(sorted(_KINDS))
        correct = rng.choice(_KINDS[category])
        others = [w for k, ws in sorted(_KINDS.items()) if k != category for w in ws]
        question = f"Which of these is a {category}?"
        choices = [correct] + rng.sample(others, 3)
    else:
        nums = rng.sample(range(10, 1000), 4)
        correct = str(max(nums))
        question = "Which of these numbers is the largest?"
        choices = [str(x) for x in nums]
    rng.shuffle(choices)
    return {"question": question, "choices": choices, "answer": choices.index(correct)}


def arithmetic(index: int, split: str) -> dict:
    return gsm8k.conversation(arithmetic_row(index, split))


def multiple_choice(index: int, split: str) -> dict:
    return mmlu.conversation(multiple_choice_row(index, split))


ARITHMETIC = Task("Arithmetic", "synthetic", key="arithmetic", conversation=arithmetic)
MULTIPLE_CHOICE = Task("MultipleChoice", "synthetic", key="multiple_choice", conversation=multiple_choice)
