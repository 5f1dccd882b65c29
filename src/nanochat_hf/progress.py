"""What a long phase is doing and when it will end, on stderr, from the main process only.

On a terminal: a tqdm bar (its own ETA). Redirected to a file: a line when the phase starts, then one at most every
`every` seconds with the count, the elapsed time and an ETA, and one when it ends; no carriage returns in logs.
A phase that is usually short and frequent (validation) passes `announce=False`: nothing is shown unless it runs
longer than a few seconds (the bar) or `every` seconds (the lines).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

from tqdm.auto import tqdm
from typing_extensions import Self


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


class Progress:
    """`with Progress("chat eval GSM8K", total=64, unit="problems") as p: ... p.update(8)`."""

    def __init__(
        self, desc: str, total: int, unit: str, enabled: bool = True, every: float = 30.0, announce: bool = True
    ):
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.enabled = enabled and total > 0
        self.done = 0
        self.bar = None
        self.said = announce
        self._start = self._last = time.monotonic()
        if not self.enabled:
            return
        if sys.stderr.isatty():
            self.bar = tqdm(
                total=total,
                desc=desc,
                unit=f" {unit}",
                dynamic_ncols=True,
                file=sys.stderr,
                delay=0 if announce else 5,
                leave=announce,
            )
        elif announce:
            self._say(f"{total:,} {unit}")

    def _say(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        if not self.enabled:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.every and self.done < self.total:
            self._last, self.said = now, True
            elapsed = now - self._start
            eta = elapsed / self.done * (self.total - self.done)
            self._say(f"{self.done:,}/{self.total:,} {self.unit}, {_clock(elapsed)} elapsed, eta {_clock(eta)}")

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        elif self.said:
            self._say(f"{self.done:,}/{self.total:,} {self.unit} in {_clock(time.monotonic() - self._start)}")
        self.enabled = False

    def wrap(self, items: Iterable) -> Iterator:
        """`items`, counting each one as it is handed out."""
        for item in items:
            yield item
            self.update()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
