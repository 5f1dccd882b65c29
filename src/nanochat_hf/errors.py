"""The error contract of every entry point (mid_train, convert, chat, chat_eval, preview_data) and of every library
layer that reports bad input.

- Bad input raises `UserError`, whose message is one line naming the file, field or value and what is expected.
  Errors of the libraries we call that a user can cause (safetensors, tokenizers, datasets, the Hub) are caught
  where we call them and raised again as `UserError`, keeping `one_line` of their message.
- An entry point runs its work through `run_cli`: a `UserError`, or an `OSError` (a path missing or unwritable, a
  full disk), is printed once as `<prog>: error: <one line>` and the exit code is 2; anything else is a bug and
  keeps its traceback. Argument errors (`OneLineArgumentParser`) read the same way. In a run of several processes
  (torchrun, accelerate launch) only rank 0 prints the line; every rank exits with the same code.

`UserError` is a `ValueError`, so code that catches `ValueError` around a call (as transformers' conventions and
our tests do) keeps working. The model and configuration files are shipped as remote code and import only torch and
transformers: they raise `ValueError`, and the layer that loads them says which file it was.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn


class UserError(ValueError):
    """Bad input the user can fix; the message is one line naming the file, field or value and what is expected."""


def one_line(error: BaseException | str) -> str:
    """The message on one line: its first line with whitespace collapsed (the error type's name if empty)."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return " ".join(text.splitlines()[0].split())


def error_line(prog: str, error: BaseException | str) -> str:
    """What an entry point prints for a user error: `<prog>: error: <one line>`."""
    return f"{prog}: error: {one_line(error)}"


def first_rank() -> bool:
    """Rank 0 of a torchrun / accelerate launch (its RANK variable), known before any process group exists; True
    for a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def run_cli(prog: str, main: Callable[[], int | None]) -> int:
    """`main()`'s exit code (0 for None); a `UserError` or `OSError` it raises becomes one line on stderr (on rank 0
    only: in a multi-process run one process says it) and exit code 2."""
    try:
        return main() or 0
    except (UserError, OSError) as e:
        if first_rank():
            print(error_line(prog, e), file=sys.stderr, flush=True)
        return 2


UNRECOGNIZED = "unrecognized arguments: "  # argparse's wording (parse_args), which our parsers repeat


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with its errors in the same one-line form (argparse prints the usage first), said by rank 0 only;
    exit code 2. An unrecognized flag that is a known one spelled with dashes for underscores (nanochat's
    `--device-batch-size` where the name is `--device_batch_size`), or the other way round, is named."""

    def error(self, message: str) -> NoReturn:
        if message.startswith(UNRECOGNIZED):
            message += self._spelling_hint(message.removeprefix(UNRECOGNIZED).split())
        self.exit(2, error_line(self.prog, f"{message} (see --help)") + "\n" if first_rank() else None)

    def _spelling_hint(self, unknown: list[str]) -> str:
        """'; did you mean --x_y?' for the first of `unknown` that is a flag of this parser (or of a subcommand's)
        but for '-' / '_' in its name ('--x-y=8' and '--x-y 8' alike); '' if none is."""
        parsers = [self] + [
            p for a in self._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()
        ]
        known: dict[str, str] = {}
        for option in (o for p in parsers for o in p._option_string_actions if o.startswith("--")):
            known.setdefault(option.replace("-", "_"), option)  # a flag's first spelling, as --help lists it
        for arg in unknown:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and (name := known.get(flag.replace("-", "_"))) and name != flag:
                return f"; did you mean {name}?"
        return ""


def add_version(parser: argparse.ArgumentParser) -> None:
    """Every command's --version: `<prog> <the installed nanochat-hf version>`."""
    from importlib.metadata import version

    parser.add_argument("--version", action="version", version=f"%(prog)s {version('nanochat-hf')}")
