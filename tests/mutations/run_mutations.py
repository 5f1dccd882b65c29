"""Deliberate breakages (issue 50): apply each patch, run the test files that must catch it, revert.

Each breakage below is one ``<name>.patch`` in this folder (a ``git diff`` against src/) and the narrowest test
selection that should fail when it is applied. The script applies a patch, runs pytest on that selection, and always
reverts (``git apply -R``, also on Ctrl-C or an error), then prints one row per breakage:

    breakage | patch | tests run | failed tests | verdict

"caught" means pytest failed and names the failed tests; "NOT CAUGHT" means the selection passed with the breakage
in place (a gap in the suite). pytest does not collect this folder (no test_*.py here).

    python tests/mutations/run_mutations.py                 # every breakage
    python tests/mutations/run_mutations.py fsdp2_stale_rows body_cap_removed   # some, by patch name
    python tests/mutations/run_mutations.py --list          # the table of breakages, nothing run
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOGS = Path(tempfile.gettempdir()) / "nanochat_hf_mutations"  # each breakage's pytest output: <name>.log

# (patch name, what is broken, pytest arguments: the files (and -k) that must fail)
BREAKAGES = [
    (
        "fsdp2_stale_rows",
        "an FSDP2 rank keeps stale rows after the second all_to_all",
        ["tests/optim/test_fsdp.py", "-k", "two_ranks"],
    ),
    (
        "clip_norm_local_fsdp2",
        "FSDP2 gradient-clipping norm from this rank's local shards only",
        ["tests/optim/test_fsdp.py", "-k", "four_ranks"],
    ),
    (
        "clip_norm_local_zero2",
        "ZeRO-2 (DDP) gradient-clipping norm from this rank's local pieces only",
        ["tests/training/test_grad_clip.py"],
    ),
    (
        "mixin_rank0_optimizer_only",
        "the mixin saves only rank 0's optimizer file",
        ["tests/integration/test_trainer_checkpoints.py", "-k", "save_and_resume"],
    ),
    (
        "refusal_call_removed",
        "the FSDP1/DeepSpeed refusal call (check_distributed_setup) removed from the Trainer",
        ["tests/integration/test_fsdp_trainer.py", "-k", "fsdp1"],
    ),
    (
        "rl_no_group_mean_baseline",
        "RL without the group-mean baseline (raw rewards as advantages)",
        ["tests/rl/test_chat_rl_parity.py", "-k", "training_on_head"],
    ),
    (
        "rl_forced_tokens_in_loss",
        "calculator-forced tokens counted in the RL loss (mask 1)",
        ["tests/rl/test_chat_rl_parity.py", "-k", "masks"],
    ),
    (
        "serve_reply_drops_last_token",
        "a server reply drops its last token (max_tokens reached)",
        ["tests/serving/test_chat.py", "-k", "max_tokens"],
    ),
    (
        "serve_cancel_not_reaching_child",
        "the cancel of a departed client does not reach the model's process",
        ["tests/serving/test_engine.py", "-k", "goes_away"],
    ),
    (
        "serve_body_cap_removed",
        "the request body cap (--max-request-bytes) removed",
        ["tests/serving/test_guards.py", "-k", "over_the_limit"],
    ),
    (
        "muon_momentum_warmup_removed",
        "the December recipe's Muon momentum warm-up removed (callback not added)",
        ["tests/integration/test_mixin.py", "-k", "schedule_and_momentum"],
    ),
    (
        "fp8_grad_e4m3",
        "fp8 training quantizes the output's gradient to float8_e4m3fn instead of HEAD's e5m2",
        ["tests/training/test_fp8.py", "-k", "bit_for_bit"],
    ),
    (
        "fp8_in_evaluation",
        "an fp8 layer in eval mode still multiplies in float8 (HEAD's disable_fp8 not matched)",
        ["tests/training/test_fp8.py", "-k", "ordinary_folder"],
    ),
    (
        "g0_rotary_float32",
        "G0's bf16 rotary tables computed in float32",
        ["tests/model/test_model.py", "tests/model/test_generations.py", "-k", "rotary or logits_equal"],
    ),
]


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, check=check, capture_output=True, text=True)


def _failed(output: str) -> list[str]:
    """The node ids pytest's short summary (-ra) lists as FAILED or ERROR."""
    return re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, flags=re.M)


def _widened(pytest_args: list[str]) -> list[str]:
    """The selection's whole files (its ``-k`` dropped)."""
    return [a for i, a in enumerate(pytest_args) if a != "-k" and (i == 0 or pytest_args[i - 1] != "-k")]


def run_one(name: str, pytest_args: list[str], timeout: float, wide: bool = False) -> tuple[list[str], str]:
    """Apply ``name``.patch, run pytest (stopping at the first failure; ``wide``: every test of the selection's
    files, to list all that catch the breakage), revert. Returns (failed node ids, verdict)."""
    patch = HERE / f"{name}.patch"
    if _git("diff", "--quiet", "--", "src", check=False).returncode != 0:
        sys.exit("run_mutations.py: error: src/ has uncommitted changes; commit or stash them first")
    _git("apply", str(patch))
    try:
        selection = _widened(pytest_args) if wide else [*pytest_args, "-x"]
        cmd = [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider"]
        # its own session, so that a timeout or Ctrl-C ends pytest AND the processes its tests started
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [], "TIMEOUT"
        except BaseException:  # Ctrl-C: stop the run, then revert (finally)
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        (LOGS / f"{name}{'.wide' if wide else ''}.log").write_text(out)
        failed = _failed(out)
        if proc.returncode == 0:
            return [], "NOT CAUGHT"
        if proc.returncode in (1, 2) and failed:
            return failed, "caught"
        tail = out.strip().splitlines()[-3:]
        return [], f"pytest exit {proc.returncode}: {' / '.join(tail)}"
    finally:
        _git("apply", "-R", str(patch))  # always: on success, failure, timeout and Ctrl-C


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="patch names to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the breakages and their tests, run nothing")
    ap.add_argument("--wide", action="store_true", help="run every test of the named files (no -k, no -x)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per breakage's pytest run (default 1800)")
    args = ap.parse_args()
    known = {name for name, _, _ in BREAKAGES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        sys.exit(f"run_mutations.py: error: unknown breakage {unknown[0]!r}; expected one of {sorted(known)}")
    rows = []
    LOGS.mkdir(exist_ok=True)
    for name, what, pytest_args in BREAKAGES:
        if args.names and name not in args.names:
            continue
        tests = shlex.join(_widened(pytest_args) if args.wide else pytest_args)
        if args.list:
            rows.append((what, f"{name}.patch", tests, "", ""))
            continue
        t0 = time.monotonic()
        failed, verdict = run_one(name, pytest_args, args.timeout, args.wide)
        print(f"{name}: {verdict} in {time.monotonic() - t0:.0f} s (log in {LOGS})", file=sys.stderr, flush=True)
        rows.append((what, f"{name}.patch", tests, ", ".join(failed) or "-", verdict))
    print("| breakage | patch | tests run | failed tests | verdict |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if any(row[4] not in ("caught", "") for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
