"""How long a command takes to answer --help, --version and an argument error, each in a fresh process.

    python benchmarks/startup.py                  # every script, 5 repeats
    python benchmarks/startup.py --repeats 9 --scripts mid_train,convert

Every answer must come before torch and transformers are imported (target: under 1 s on 2 shared cores). The
baseline, measured in the same run, is `python -c "import torch"`: what each of these answers took at least before
the package's import was made light (it then imported torch and transformers' model stack, 6-10 s at load 1-3).
The cases alternate within each repeat (a change in load hits all alike); the table shows the median repeat and
its ratio to the baseline. The 1-minute load average is printed before and after; OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("mid_train", "base_train", "convert", "chat", "chat_eval", "preview_data", "serve")
BASELINE = "import torch"


def cases(scripts: list[str]) -> dict[str, list[str]]:
    """Case name -> command line; the baseline first."""
    found = {
        BASELINE: [sys.executable, "-c", "import torch"],
        "import nanochat_hf": [sys.executable, "-c", "import nanochat_hf"],
    }
    for script in scripts:
        path = str(ROOT / "scripts" / f"{script}.py")
        for flag in ("--help", "--version", "--no-such-flag"):
            found[f"{script} {flag}"] = [sys.executable, path, flag]
    return found


def seconds(argv: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scripts", default=",".join(SCRIPTS), help="comma-separated script names (default: all of them)")
    args = p.parse_args(argv)
    commands = cases([s for s in args.scripts.split(",") if s])
    print(
        f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {version('torch')}, "
        f"transformers {version('transformers')}; 1-minute load average before: {os.getloadavg()[0]:.2f}"
    )
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            times[name].append(seconds(command))
    base = statistics.median(times[BASELINE])
    rows = [
        {"case": name, "seconds": statistics.median(t), "ratio": statistics.median(t) / base}
        for name, t in times.items()
    ]
    print(f"1-minute load average after: {os.getloadavg()[0]:.2f}; median of {args.repeats} repeats\n")
    print("| case | seconds | / import torch |")
    print("|---|---:|---:|")
    for row in rows:
        print(f"| {row['case']} | {row['seconds']:.2f} | {row['ratio']:.2f} |")
    return rows


if __name__ == "__main__":
    main()
