"""scripts/chat_rl.py as a user runs it, on the tiny model (conftest.py): chat_rl.py's reward curve, the per-step
line with its sampling / training split and ETA, the pass@k table, Ctrl-C leaving the last checkpoint intact, the
resume continuing the reward curve with the rewards an uninterrupted run has, the report and plot, and the final
folder's export to nanochat's chatrl_checkpoints."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from nanochat_hf.conversion import load_from_nanochat, to_nanochat

from .conftest import DATA, REPO_ROOT, tiny_args

SCRIPT = str(REPO_ROOT / "scripts" / "chat_rl.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
STEP_LINE = re.compile(
    r"^step 0000(\d)/00005 \(\d+\.\d\d%\) \| reward: \d\.\d{4} \| loss: -?\d\.\d{6} \| lrm: \d\.\d\d \| "
    r"sampling: \d+\.\d\ds \| training: \d+\.\d\ds \| eta: \d+\.\dm$",
    re.M,
)


def rewards(history: list[dict]) -> list[tuple[int, float]]:
    return [(h["step"], h["reward"]) for h in history if "reward" in h]


def chat_rl(args: list[str], interrupt_after: str | None = None) -> subprocess.CompletedProcess:
    """Run the script; with `interrupt_after`, send SIGINT (Ctrl-C) once a stdout line contains it."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = []
    if interrupt_after:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            seen.append(line)
            if interrupt_after in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + rest, err)


def chat_rl_here(args: list[str], capsys) -> subprocess.CompletedProcess:
    """The script's main(argv) in this process (where a fresh process is not what is tested); its exit code and
    output as `chat_rl` returns them. Pass num_threads="1": the thread count the script's runs here have."""
    from nanochat_hf.rl.run import main

    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["chat_rl", *args], code, out, err)


def check_chatrl_export(run: Path, base: Path) -> None:
    """to-nanochat of the final folder into chatrl_checkpoints/d4 at the run's last step; read back (nanochat's
    files, nanochat's names) it gives the final model's logits. (HEAD's own load_model("rl") and chat_eval -i rl
    on such an export, run by hand: docs/rl.md.)"""
    to_nanochat(run, base / "chatrl_checkpoints" / "d4")
    assert json.loads((base / "chatrl_checkpoints" / "d4" / "meta_000005.json").read_text())["model_config"]
    back, _ = load_from_nanochat(base / "chatrl_checkpoints" / "d4", base / "tokenizer", trust_pickle=True)
    final = AutoModelForCausalLM.from_pretrained(run, trust_remote_code=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(back.float()(input_ids=ids).logits, final.float()(input_ids=ids).logits)


@pytest.mark.slow
def test_ctrl_c_then_resume_continues_the_reward_curve(tmp_path, capsys):
    """Slow: 3 runs of 5 RL steps; the Ctrl-C is sent to a real process, the whole run and the resume run in this
    one."""
    whole = chat_rl_here(tiny_args(tmp_path / "whole", eval_every="4", eval_examples="4", num_threads="1"), capsys)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert [int(s) for s in STEP_LINE.findall(whole.stdout)] == [1, 2, 3, 4, 5]
    assert re.search(
        r"^step 00004 \| pass@k on 4 problems .*\n\| +pass@1 \| +pass@2 \| +pass@3 \| +pass@4 \|\n", whole.stdout, re.M
    )
    report = (tmp_path / "whole" / "report.md").read_text()
    assert "| 5 | " in report and "## pass@k" in report and (tmp_path / "whole" / "training_curves.png").is_file()
    history = json.loads((tmp_path / "whole" / "trainer_state.json").read_text())["log_history"]
    # chat_rl.py's settings of the reference run: its seeds, sampled on weights that stay within float32 round-off
    # of HEAD's, draw HEAD's rollouts, so the whole loop's reward curve is chat_rl.py's, step for step
    assert [r for _, r in rewards(history)] == json.loads((DATA / "rl_reference.json").read_text())["rewards"]
    check_chatrl_export(tmp_path / "whole", tmp_path / "nanochat")

    out = tmp_path / "interrupted"
    args = tiny_args(out, eval_every="4", eval_examples="4", save_every="2", num_threads="1")
    stopped = chat_rl(args, interrupt_after="step 00003/")
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith("chat_rl: interrupted at step ")
    assert (out / "checkpoint-2" / "model.safetensors").is_file() and not (out / "checkpoint-4").exists()

    resumed = chat_rl_here([*args, "--resume_from_checkpoint", "last"], capsys)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [int(s) for s in STEP_LINE.findall(resumed.stdout)] == [3, 4, 5]
    final = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert rewards(final) == rewards(history)  # steps 1..5: the same samples (k / 16: exact), the same weights
    assert "| 1 | " in (out / "report.md").read_text()  # the report's curve starts at step 1, not at the resume


@pytest.mark.parametrize("checkpoint", [False, True])
def test_ctrl_c_says_what_is_true(tmp_path, capsys, monkeypatch, checkpoint):
    """Ctrl-C (here: at the first step) says how to resume only when there is a complete checkpoint to resume
    from, else that there is nothing to resume; before training, the CPU thread line mid_train prints."""
    from nanochat_hf.rl.run import main
    from nanochat_hf.rl.trainer import NanoChatGRPOTrainer
    from nanochat_hf.training.checkpoint.layout import OPTIMIZER_FILE, SCHEDULER_FILE

    def ctrl_c(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(NanoChatGRPOTrainer, "train", ctrl_c)
    out = tmp_path / "out"
    if checkpoint:  # what resolve_checkpoint counts as complete (an earlier run's, kept in output_dir)
        for name in ("trainer_state.json", "model.safetensors", SCHEDULER_FILE, OPTIMIZER_FILE.format(rank=0)):
            (out / "checkpoint-2" / name).parent.mkdir(parents=True, exist_ok=True)
            (out / "checkpoint-2" / name).write_text("{}")
    assert main(tiny_args(out, save_every="2", num_threads="1")) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert "chat_rl: 1 CPU thread(s) (--num_threads 1)" in err
    if checkpoint:
        assert err[-1] == (
            f"chat_rl: interrupted at step 0; resume with --resume_from_checkpoint last ({out / 'checkpoint-2'}, "
            "the newest complete checkpoint)"
        )
    else:
        assert err[-1] == (
            "chat_rl: interrupted at step 0; no checkpoint was written (they are written every 2 steps): nothing "
            "to resume, run it again to start over"
        )
