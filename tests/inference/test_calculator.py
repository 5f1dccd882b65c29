"""The calculator tool forces nanochat's text: use_calculator of nanochat's engine.py, then str(result).

data/nanochat_calculator.json holds [expression, what nanochat's engine forces or null] pairs written by nanochat's
own use_calculator at 790f3be and at 92d63d4 (the two files are identical; the function did not change):
`tests/make_nanochat_reference.py calculator` (see data/README.md).
"""

import json
from pathlib import Path

import pytest

from nanochat_hf.inference import calculate

CASES = json.loads((Path(__file__).parent / "data" / "nanochat_calculator.json").read_text())


@pytest.mark.parametrize("expr, expected", CASES, ids=[e[:24] for e, _ in CASES])
def test_same_text_as_nanochat(expr, expected):
    assert calculate(expr) == expected


def test_the_reference_shows_nanochat_formatting():
    cases = dict(CASES)
    assert cases["10/2"] == "5.0" and cases["0.1+0.2"] == "0.30000000000000004"  # str(float), not "5" / "0.3"
    assert cases["3**2"] is None and cases["7%3"] is None and cases["1e3"] is None
    assert cases["'a,b,c'.count(',')"] == "4"  # commas are removed inside strings too
    assert cases["'strawberry'.count('r')"] == "3"


@pytest.mark.parametrize(
    "expr",
    [
        "'a'.center(99999999999).count('a')",  # nanochat's eval would run out of memory or time
        "'0'.zfill(9999999999).count('0')",
        "'abc'.count('a').bit_length()",
        "('a'.count('a') for x in 'abc')",  # str() of a generator has an address in it
        "'abc'.count('a') .real",
        None,
    ],
)
def test_what_we_do_not_run_gives_no_result(expr):
    assert calculate(expr) is None
