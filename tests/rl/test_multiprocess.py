"""scripts/chat_rl.py in 2 processes, started as docs/rl.md says (`accelerate launch --multi_gpu --num_processes 2`,
gloo on CPU): one run of world size 2 (each process half of a step's prompts), chat_rl.py's reward curve step for
step as one process has it, the pass@k of the split evaluation summed across the processes, one line per step."""

import json
import os
import subprocess
import sys

import pytest

from nanochat_hf.rl.rewards import pass_at_k

from .conftest import DATA, REPO_ROOT, tiny_args

sys.path.insert(0, str(REPO_ROOT / "tests" / "training"))
from mp_launch import launch_command  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_two_processes_train_as_one_run(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    script = str(REPO_ROOT / "scripts" / "chat_rl.py")
    command = [*launch_command(2, script), *tiny_args(out, eval_every="5", eval_examples="4")]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads((DATA / "rl_reference.json").read_text())
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    # each process samples its rows with chat_rl.py's seeds, the gradients are averaged: one process's curve
    assert [h["reward"] for h in history if "reward" in h] == ref["rewards"]
    # step 0's pass@k on the first 4 test problems (2 per process): HEAD's outcomes on them, summed over both
    outcomes = [[o["is_correct"] == 1 for o in r["outcomes"]] for r in ref["eval"][0]["records"][:4]]
    step0 = next(h for h in history if "pass@1" in h)
    assert [step0[f"pass@{k}"] for k in range(1, 5)] == pytest.approx(pass_at_k(outcomes, 4), abs=1e-7)
    for line in ("step 00005/00005 (100.00%)", "step 00000 | pass@k on 4 problems", "final model and report in"):
        assert proc.stdout.count(line) == 1, proc.stdout  # rank 0 says it, once
    assert "chat_rl: 1 CPU thread(s)" in proc.stderr and "divided among 2 processes" in proc.stderr
