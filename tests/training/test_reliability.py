"""mid_train's reliability pieces through the real entry point: output_dir policy, final save staged inside
output_dir, verified resume with fallback, run fingerprints, umask-derived file modes, no pickles, one-line errors,
and the chat evaluation at the end of the run."""

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanochat_hf.training.run import main

from .conftest import checkpoint_requested_at

BASE = ["--num_iterations", "4", "--save_steps", "2", "--eval_every", "2"]


def _run(argv: list[str], umask: int | None = None) -> tuple[dict, str]:
    """main(argv) in-process; returns (metrics, stdout)."""
    out = io.StringIO()
    old = os.umask(umask) if umask is not None else None
    try:
        with contextlib.redirect_stdout(out):
            metrics = main(argv)
    finally:
        if old is not None:
            os.umask(old)
    return metrics, out.getvalue()


def _fail(argv: list[str], capsys) -> str:
    """main(argv) must exit non-zero with exactly one line on stderr; returns that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code not in (0, None)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mid_train: error: "), err
    return lines[0]


def _tree(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def _losses(checkpoint: Path) -> list:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"], h["learning_rate"]) for h in history if "lrm" in h]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run with checkpoints at steps 2 and 4 and a SpellingBee chat eval, under umask 002."""
    from .conftest import TINY_ARGS

    tmp = tmp_path_factory.mktemp("rel")
    out = tmp / "run"
    args = [*TINY_ARGS, *BASE, "--chat_eval_tasks", "SpellingBee", "--chat_eval_max_problems", "4"]
    metrics, stdout = _run([*args, "--output_dir", str(out)], umask=0o002)
    return tmp, out, args, stdout


@pytest.mark.slow
def test_chat_eval_in_console_report_and_model_card(run):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    _, out, _, stdout = run
    assert "| SpellingBee | generative |" in stdout and "ChatCORE (over 1 of 6 tasks)" in stdout
    report = (out / "report.md").read_text()
    assert "## Chat evaluation" in report and "| SpellingBee | generative |" in report and "| 4 |" in report
    card = (out / "README.md").read_text()
    meta = card.split("---")[1]
    assert "model-index:" in meta and "name: SpellingBee" in meta and "generative accuracy (4 problems)" in meta


@pytest.mark.slow
def test_files_keep_umask_mode_and_no_pickles(run):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    _, out, _, _ = run
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {
        "model.safetensors",
        "optimizer.rank0.safetensors",
        "rng_state.rank0.safetensors",
        "report.md",
        "run_fingerprint.json",
        "training_curves.png",
    } <= {p.name for p in files}
    wrong = {str(p.relative_to(out)): oct(p.stat().st_mode & 0o777) for p in files if p.stat().st_mode & 0o777 != 0o664}
    assert not wrong, wrong  # umask 002 -> rw-rw-r-- (safetensors' own writer would give 0600)
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pkl")]  # no training_args.bin anywhere
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging leftovers


@pytest.mark.slow
def test_the_run_writes_exactly_the_files_the_layout_declares(run, tmp_path):
    """Every file of output_dir and of its checkpoints is either transformers' own (what save_pretrained writes for
    the model and the tokenizer) or named in checkpoint/layout.py: a name spelled anywhere else would show here.

    Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what is
    tested."""
    from transformers import AutoTokenizer

    from nanochat_hf import NanoChatGPTForCausalLM
    from nanochat_hf.training.checkpoint import layout

    _, out, _, _ = run
    NanoChatGPTForCausalLM.from_pretrained(out).save_pretrained(tmp_path / "hf")
    AutoTokenizer.from_pretrained(out).save_pretrained(tmp_path / "hf")
    transformers_own = {p.name for p in (tmp_path / "hf").iterdir()}
    model = transformers_own | {layout.TRAINING_ARGS_FILE}
    ours = {*layout.SHARED_FILES, *(f.format(rank=0) for f in (*layout.PER_PROCESS_FILES, *layout.PER_SHARD_FILES))}
    for step in (2, 4):
        assert {p.name for p in (out / layout.checkpoint_name(step)).iterdir()} == model | ours
    run_files = {layout.TRAINER_STATE_FILE, layout.REPORT_FILE, layout.CURVES_FILE, layout.MODEL_CARD_FILE}
    checkpoints = {layout.checkpoint_name(2), layout.checkpoint_name(4)}
    assert {p.name for p in out.iterdir()} == model | run_files | checkpoints
    assert all(layout.CHECKPOINT_RE.match(name) for name in checkpoints)


@pytest.mark.slow
def test_output_dir_refusals_keep_the_earlier_run(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    before = _tree(out)
    line = _fail([*args, "--output_dir", str(out)], capsys)
    assert "already holds a run" in line and "--overwrite_output_dir" in line
    assert _tree(out) == before
    afile = tmp / "afile"
    afile.write_text("mine")
    assert "is a file" in _fail([*args, "--output_dir", str(afile)], capsys)
    assert afile.read_text() == "mine"


@pytest.mark.slow
def test_overwrite_replaces_checkpoint_folders_whole(run):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    again = tmp / "again"
    shutil.copytree(out, again)
    stale = again / "checkpoint-2" / "optimizer.rank1.safetensors"  # as if an earlier 2-process run wrote it
    shutil.copy(again / "checkpoint-2" / "optimizer.rank0.safetensors", stale)
    _run([*args, "--chat_eval_tasks", "", "--output_dir", str(again), "--overwrite_output_dir", "true"])
    assert not stale.exists()  # the new checkpoint-2 is this run's alone
    assert not [p.name for p in again.iterdir() if p.name.startswith(".")]
    assert _losses(again / "checkpoint-4") == _losses(out / "checkpoint-4")


@pytest.mark.slow
def test_final_save_writes_nothing_beside_output_dir(run):
    """The parent of output_dir refuses every write (an audit hook stands in for a read-only parent, as root
    ignores permissions): the run still finishes and saves its model.

    Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what is
    tested."""
    tmp, _, args, _ = run
    parent = tmp / "locked"
    (parent / "out").mkdir(parents=True)
    guard = {"on": False}

    def hook(event, hook_args):
        if not guard["on"] or event not in ("open", "os.mkdir", "os.rename", "os.remove", "os.rmdir"):
            return
        if event == "open" and (len(hook_args) < 2 or not hook_args[1] or hook_args[1] == "r"):
            return
        for p in hook_args[:2]:
            if isinstance(p, (str, bytes, os.PathLike)) and Path(os.fsdecode(p)).resolve().parent == parent.resolve():
                raise PermissionError(13, "Permission denied (test: read-only parent)", os.fsdecode(p))

    sys.addaudithook(hook)
    guard["on"] = True
    try:
        _run(
            [
                *args,
                "--chat_eval_tasks",
                "",
                "--num_iterations",
                "2",
                "--save_steps",
                "0",
                "--output_dir",
                str(parent / "out"),
            ]
        )
    finally:
        guard["on"] = False
    assert (parent / "out" / "model.safetensors").is_file()
    assert [p.name for p in parent.iterdir()] == ["out"]


@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    resumed = tmp / "resumed"
    resumed.mkdir()
    for name in ("checkpoint-2", "checkpoint-4"):
        shutil.copytree(out / name, resumed / name)
    shard = resumed / "checkpoint-4" / "optimizer.rank0.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])  # truncated
    # an explicit path to it: one line naming the file
    line = _fail(
        [*args, "--output_dir", str(resumed), "--resume_from_checkpoint", str(resumed / "checkpoint-4")], capsys
    )
    assert "optimizer.rank0.safetensors" in line and "safetensors" in line
    # `true`: falls back to checkpoint-2, says so, and reproduces the original steps 3-4
    _, stdout = _run([*args, "--chat_eval_tasks", "", "--output_dir", str(resumed), "--resume_from_checkpoint", "true"])
    assert "skipping checkpoint-4" in stdout and "optimizer.rank0.safetensors" in stdout
    assert f"resuming from {resumed / 'checkpoint-2'}" in stdout
    assert _losses(resumed / "checkpoint-4") == _losses(out / "checkpoint-4")
    a, b = load_file(str(out / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_resume_refuses_a_changed_seed_and_applies_a_changed_lr(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    resumed = tmp / "lr"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    before = _tree(resumed)
    line = _fail([*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true", "--seed", "7"], capsys)
    assert "seed was 42" in line and "is 7 now" in line
    assert _tree(resumed) == before
    _, stdout = _run(
        [
            *args,
            "--chat_eval_tasks",
            "",
            "--output_dir",
            str(resumed),
            "--resume_from_checkpoint",
            "true",
            "--unembedding_lr",
            "0.008",
        ]
    )
    assert "unembedding_lr changed 0.004 -> 0.008: applied from step 2" in stdout
    old, new = _losses(out / "checkpoint-4"), _losses(resumed / "checkpoint-4")
    assert new[:2] == old[:2]  # steps 1-2 come from the checkpoint
    for (_, _, lr_old), (_, _, lr_new) in zip(old[2:], new[2:]):  # the logged rate is lm_head's (unembedding)
        assert lr_new == pytest.approx(2 * lr_old)


@pytest.mark.slow
def test_resume_refuses_another_model_config(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    resumed = tmp / "other-model"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    before = _tree(resumed)
    line = _fail([*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true", "--demo_depth", "3"], capsys)
    assert "the model config differs: n_layer was 2 in the checkpoint and is 3 now" in line
    assert _tree(resumed) == before


@contextlib.contextmanager
def _file_size_limit(nbytes: int):
    """A file-size limit (ulimit -f) on this process: writes past it fail with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.slow
def test_full_disk_during_a_checkpoint(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, out, args, _ = run
    args = [*args, "--chat_eval_tasks", ""]
    resumed = tmp / "full"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    before = _tree(resumed)
    with _file_size_limit(1 << 20):  # the tiny model's model.safetensors is about 5.8 MB
        line = _fail([*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true"], capsys)
    assert line.startswith(
        f"mid_train: error: checkpoint checkpoint-4 could not be saved in {resumed}: a file would "
        "exceed the file-size limit (ulimit -f); it needs about "
    ), line
    assert "MB free there" in line and "what was staged is removed" in line
    assert _tree(resumed) == before and sorted(p.name for p in resumed.iterdir()) == ["checkpoint-2"]
    _run([*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true"])  # room again: resume works
    assert _losses(resumed / "checkpoint-4") == _losses(out / "checkpoint-4")


@pytest.mark.slow
def test_full_disk_during_the_final_save(run, capsys):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    tmp, _, args, _ = run
    args = [*args, "--chat_eval_tasks", ""]
    final = tmp / "full-final"
    final.mkdir()
    with _file_size_limit(1 << 20):
        line = _fail([*args, "--save_steps", "0", "--output_dir", str(final)], capsys)  # no checkpoints
    assert line.startswith(f"mid_train: error: the model could not be saved in {final}: a file would exceed"), line
    assert list(final.iterdir()) == []  # no staging folder left


@pytest.mark.slow
def test_jit_checkpoint_on_sigterm_resumes_with_the_same_logged_losses(run, monkeypatch):
    """Slow: it trains (or resumes) a tiny mid_train run in this process: a run's files, resumes and refusals are what
    is tested."""
    from nanochat_hf.training import run as run_module

    tmp, out, args, _ = run
    args = [*args, "--chat_eval_tasks", ""]
    jit = tmp / "jit"
    checkpoint_requested_at(monkeypatch, run_module, 1)  # during step 2
    with pytest.raises(SystemExit) as e:  # preempted: exit 143, no final model
        _run([*args, "--enable_jit_checkpoint", "true", "--save_steps", "100", "--output_dir", str(jit)])
    monkeypatch.undo()
    assert e.value.code == 143 and not (jit / "model.safetensors").exists()
    assert sorted(p.name for p in jit.glob("checkpoint-*")) == ["checkpoint-2"]  # at the end of step 2, then stop
    assert _losses(jit / "checkpoint-2") == _losses(out / "checkpoint-2")  # its log line and EMA are in it
    _run([*args, "--output_dir", str(jit), "--resume_from_checkpoint", "true"])
    assert _losses(jit / "checkpoint-4") == _losses(out / "checkpoint-4")


def test_malformed_yaml_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("num_iterations: 4\n  device_batch_size: [2\n")
    line = _fail([str(cfg)], capsys)
    assert str(cfg) in line and "not valid YAML" in line


def test_unknown_chat_eval_task_is_one_line(tmp_path, capsys):
    from .conftest import TINY_ARGS

    line = _fail([*TINY_ARGS, "--chat_eval_tasks", "SpellingBee,Trivia", "--output_dir", str(tmp_path / "o")], capsys)
    assert "'Trivia'" in line and "SpellingBee" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_sigterm_mid_run_leaves_a_checkpoint_says_how_to_resume_and_exits_143(tmp_path):
    """A real `python scripts/mid_train.py` process sent SIGTERM after its 5th step (as a cluster preempts): it
    finishes the running step, saves that step's checkpoint, says in one line where it stopped and the command to
    resume, exits 143, and writes no final model. That command continues the run to the uninterrupted run's
    logged losses. Slow: a fresh process (what the signal needs) through transformers' 3 s wait (`preempt`); the
    uninterrupted run and the resume run in-process, 1 thread each."""
    import shlex
    import subprocess

    from .conftest import TINY_ARGS
    from .mp_launch import PREEMPT_STEPS, preempt

    script = str(Path(__file__).resolve().parents[2] / "scripts" / "mid_train.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [*TINY_ARGS, "--num_iterations", PREEMPT_STEPS, "--eval_every", "1000", "--spelling_eval_rows", "0"]
    args += ["--num_threads", "1"]  # the same thread count in-process and in the child
    full, out = tmp_path / "full", tmp_path / "run"
    _run([*args, "--output_dir", str(full)])
    proc = subprocess.Popen([sys.executable, script, *args, "--output_dir", str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    preempt(proc)
    stdout, stderr = proc.communicate(timeout=600)
    ours = [line for line in stderr.splitlines() if line.startswith("mid_train: ")]
    assert proc.returncode == 143 and len(ours) == 1, stderr[-3000:]
    step = int(ours[0].split("preempted (SIGTERM) at step ")[1].split(" ")[0])
    assert 5 <= step < int(PREEMPT_STEPS)
    where = out / f"checkpoint-{step}"
    assert ours[0].startswith(f"mid_train: preempted (SIGTERM) at step {step} of {PREEMPT_STEPS}: {where} is")
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert not (out / "model.safetensors").exists() and not (out / "report.md").exists()
    assert "model written to" not in stdout
    command = shlex.split(ours[0].split("with any number of processes: ")[1])
    assert command[0] == "python" and command[-2:] == ["--resume_from_checkpoint", "true"]
    assert Path(command[1]).resolve() == Path(script).resolve()
    _run(command[2:])  # the printed command's arguments, run by mid_train's main
    history = [json.loads((run / "trainer_state.json").read_text())["log_history"] for run in (out, full)]
    losses = [[(h["step"], h["loss"]) for h in run if "lrm" in h] for run in history]
    assert len(losses[0]) == int(PREEMPT_STEPS) and losses[0] == losses[1]
