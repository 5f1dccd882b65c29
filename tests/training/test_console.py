"""What a user sees of mid_train: --help, the step line's ETA, the chat eval offline, and Ctrl-C."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from nanochat_hf.training.arguments import REFUSED, parse_args
from nanochat_hf.training.callbacks import format_log

from .conftest import REPO_ROOT, TINY_ARGS

KNOBS = (
    "device_batch_size",
    "max_seq_len",
    "total_batch_size",
    "matrix_lr",
    "embedding_lr",
    "unembedding_lr",
    "init_lr_frac",
    "weight_decay",
    "eval_every",
    "eval_tokens",
    "num_iterations",
    "dry_run",
    "dtype",
)


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args([*argv, "--help"])
    return " ".join(out.getvalue().split())  # argparse wraps the lines at the terminal width


def test_help_hides_refused_fields_and_shows_one_default_per_knob():
    text = _help([])
    for name in REFUSED:
        assert f"--{name} " not in text and f"[--{name} " not in text, name
    with pytest.raises(ValueError, match="learning_rate=0.1 is not used by this recipe"):
        parse_args(["--learning_rate", "0.1"])  # hidden, still refused in one line
    assert (
        "--resume_from_checkpoint RESUME_FROM_CHECKPOINT, --resume-from-checkpoint RESUME_FROM_CHECKPOINT true: "
        "continue from the newest intact checkpoint-<step>" in text
    )
    for knob in KNOBS:
        entry = text.split(f"--{knob.replace('_', '-')} ")[1].split(" --")[0]  # the help after the flag's names
        assert len(entry.split()) > 3, (knob, entry)  # our own text, not just the metavar
        assert entry.count("default") <= 1, (knob, entry)
    # the demo config's value (what this command line gets), once; nanochat's with a model source
    assert "per_device_train_batch_size) (default: 8)" in text
    assert "per_device_train_batch_size) (default: 32)" in _help(["--model_source", "some/repo"])


def test_step_line_shows_warm_up_then_total_time_and_an_eta():
    class State:
        global_step, max_steps = 3, 100

    logs = {
        "lrm": 1.0,
        "progress": 3.0,
        "loss": 2.0,
        "dt_ms": 5.0,
        "tok_per_sec": 10.0,
        "total_time_min": 0.0,
        "warmup_time_min": 0.52,
        "eta_min": 12.34,
    }
    assert format_log(logs, State).endswith("| warm-up: 0.52m | eta: 12.3m")
    State.global_step = 11
    del logs["warmup_time_min"]
    assert format_log(logs, State).endswith("| total time: 0.00m | eta: 12.3m")


@pytest.mark.slow
def test_offline_chat_eval_task_is_skipped_and_the_report_written(tmp_path, monkeypatch):
    """A hub task while offline (datasets raises ConnectionError): one line, the other task runs, report.md and the
    model card are written (the run used to crash after saving the model).

    Slow: a whole mid_train run with its evaluation, report and model card: the crash it guards against came after
    saving."""
    from nanochat_hf.training.run import main

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr("datasets.load_dataset", offline)
    out, stdout = tmp_path / "out", io.StringIO()
    with contextlib.redirect_stdout(stdout):
        main(
            [
                *TINY_ARGS,
                "--num_iterations",
                "2",
                "--spelling_eval_rows",
                "0",
                "--chat_eval_tasks",
                "ARC-Easy,SpellingBee",
                "--chat_eval_max_problems",
                "2",
                "--output_dir",
                str(out),
            ]
        )
    lines = stdout.getvalue().splitlines()
    skipped = [line for line in lines if "skipped" in line]
    assert skipped == [
        (
            "mid_train: chat eval ARC-Easy skipped: could not load allenai/ai2_arc/ARC-Easy split 'test' "
            "(Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)); offline? give local "
            "files of the same layout with data_files"
        )
    ]
    report = (out / "report.md").read_text()
    assert "| SpellingBee | generative |" in report and "ARC-Easy" not in report
    assert "name: SpellingBee" in (out / "README.md").read_text()


def _interrupt(args: list[str], tmp_path, after: str) -> subprocess.CompletedProcess:
    """Run mid_train, send SIGINT (Ctrl-C) once a stdout line contains `after`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "scripts" / "mid_train.py"), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        seen.append(line)
        if after in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + rest, err)


@pytest.mark.slow
def test_ctrl_c_leaves_a_resumable_checkpoint_or_nothing(tmp_path):
    args = [*TINY_ARGS, "--num_iterations", "400", "--eval_every", "0"]
    out = tmp_path / "with-checkpoints"
    proc = _interrupt([*args, "--save_steps", "2", "--output_dir", str(out)], tmp_path, "step 00003/")
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("mid_train: interrupted at step ")
        and "can be resumed with --resume_from_checkpoint true" in last
    ), last
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging left

    out = tmp_path / "no-checkpoints"
    proc = _interrupt([*args, "--output_dir", str(out)], tmp_path, "step 00002/")
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mid_train: interrupted at step ") and f"removed {out}" in last, last
    assert not out.exists()


def test_library_noise_is_dropped_and_the_rest_kept(caplog):
    import logging

    import transformers

    from nanochat_hf.training.run import quiet_libraries

    quiet_libraries(main_process=True)
    try:
        assert transformers.utils.logging.tqdm(range(2), desc="Writing model shards").disable
        assert not transformers.utils.logging.tqdm(range(2), desc="Loading weights").disable
        with caplog.at_level(logging.WARNING):
            logger = logging.getLogger("transformers.training_args")
            logger.warning(
                "The speedups for torchdynamo mostly come with GPU Ampere or higher and which is not detected here."
            )
            logger.warning("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]
        quiet_libraries(main_process=False)
        assert transformers.utils.logging.tqdm(range(2), desc="Loading weights").disable  # rank 0 shows it
    finally:
        transformers.utils.logging.set_tqdm_hook(None)
        import datasets

        datasets.enable_progress_bars()
        for name in ("huggingface_hub", "datasets"):
            logging.getLogger(name).setLevel(logging.NOTSET)
