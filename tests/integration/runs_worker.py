"""The runs of tests/integration's workers, one after another in ONE launch (a launch costs seconds of imports, a
run a fraction of one): for conftest.py's shared runs.

    python runs_worker.py OUT_DIR RUN [RUN ...]    (under `accelerate launch` for several gloo processes)
    RUN: '["NAME", WORKER, ARG, ...]'  WORKER: trainer, fsdp_trainer or fsdp_trl, whose <WORKER>_worker.py's
         run(OUT_DIR/NAME, [ARG, ...]) it calls

Each run writes to OUT_DIR/NAME, and what each rank printed there (stdout.rank<r>.txt). A run that opens a gloo
group of one process itself (the refusals) comes after the plain-process training runs of its launch.
"""

import contextlib
import importlib
import json
import os
import sys
from pathlib import Path


def main():
    rank = os.environ.get("RANK", "0")
    for name, worker, *args in map(json.loads, sys.argv[2:]):
        out = Path(sys.argv[1]) / name
        out.mkdir(parents=True, exist_ok=True)
        run = importlib.import_module(f"{worker}_worker").run  # on first use: TRL only where a run needs it
        with open(out / f"stdout.rank{rank}.txt", "w") as said, contextlib.redirect_stdout(said):
            run(out, args)


if __name__ == "__main__":
    main()
