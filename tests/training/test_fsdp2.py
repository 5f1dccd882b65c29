"""mid_train under FSDP2 (`--fully_shard true`: Accelerate enables FSDP on GPUs only, so CPU gloo processes shard
with fully_shard): 2 processes accumulating 2 micro-batches each train like one, the final folder is one ordinary
model folder (from_pretrained in a fresh process, convert.py to-nanochat), a FSDP2 checkpoint resumes on 2 FSDP2
processes and on 1 plain process (4 micro-batches), and the switch is refused where it makes no sense."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanochat_hf.errors import UserError
from nanochat_hf.training.arguments import parse_args

sys.path.insert(0, str(Path(__file__).parent))
from mp_launch import MP_ARGS, launch_mid_train  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# a spelling evaluation and the sample chat after training: generation, which FSDP2 needs a whole copy for; 2
# micro-batches per process and step (4 on one process): FSDP2 defers the first one's reduce-scatter
RUN = ["--model_source", "demo", "--demo_depth", "2", *MP_ARGS, "--total_batch_size", "512", "--num_iterations", "6",
       "--save_steps", "3", "--eval_every", "3", "--polar_dtype", "float32", "--spelling_eval_rows", "2"]  # fmt: skip
FSDP2 = ["--fully_shard", "true"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _launch(tmp, out, nproc, extra=(), env=None):
    return launch_mid_train([*RUN, "--output_dir", str(out), *extra], tmp, nproc, timeout=300, env=env)


def _losses(run: Path):
    """(step, nanochat's logged loss: the mean over the step's micro-batches of all ranks) of each training step."""
    history = json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["train_loss_mean"]) for h in history if "lrm" in h]


def _worst(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(((a[k].float() - b[k].float()).norm() / b[k].float().norm()).item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-process FSDP2 run and one process on the same global batches (INTERLEAVE, mp_worker.py)."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    _launch(tmp, tmp / "fsdp2", 2, FSDP2)
    _launch(tmp, tmp / "one", 1, env={"INTERLEAVE": "1"})
    return tmp


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp2_trains_like_one_process_and_writes_one_ordinary_folder(runs, load_script):
    fsdp2, one = runs / "fsdp2", runs / "one"
    got, expected = _losses(fsdp2), _losses(one)
    assert [g[0] for g in got] == list(range(1, 7))
    assert got == [pytest.approx(e, rel=1e-5) for e in expected]
    # each step's accumulated, averaged gradient (2 probed parameters, gathered whole on each rank: mp_worker.py) is
    # the one process's of the same 4 micro-batches, up to float32 summation order: (a0 + a1) + (b0 + b1) here,
    # ((a0 + b0) + a1) + b1 there
    g0, g = load_file(fsdp2 / "grads.rank0.safetensors"), load_file(one / "grads.rank0.safetensors")
    assert sorted(g0) == sorted(g) and len(g) == 12  # 6 steps x 2 probed parameters
    assert all((g0[k] - g[k]).norm() <= 1e-5 * g[k].norm() for k in g)  # measured: 1.6e-6 at most (step 6)
    # the final parameters, gathered on each rank (mp_worker.py): whole, alike, the one process's up to summation order
    p0, p1 = (load_file(fsdp2 / f"params.rank{r}.safetensors") for r in (0, 1))
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
    # 6 Muon steps amplify that order's last bits: 1.8e-5 with 2 micro-batches per process (1.9e-5 when each
    # micro-batch is reduce-scattered at once; under 1e-5 with one micro-batch per process)
    assert _worst(p0, load_file(one / "params.rank0.safetensors")) < 3e-5
    # one ordinary folder: the one process's files (no per-rank ones, none of torch's _fsdp_*.py), and the model's own
    # class in its config (not fully_shard's FSDP subclass); params/grads.rank<r> are mp_worker.py's
    ours = ("params.", "grads.")
    files = [sorted(p.name for p in run.iterdir() if not p.name.startswith(ours)) for run in (fsdp2, one)]
    assert files[0] == files[1]
    config, ref_config = (json.loads((run / "config.json").read_text()) for run in (fsdp2, one))
    assert config["auto_map"] == ref_config["auto_map"] and config["architectures"] == ref_config["architectures"]
    # loaded by from_pretrained (its remote code) in a fresh process: the run's own weights
    script = (
        "import sys; from safetensors.torch import save_file; from transformers import AutoModelForCausalLM; "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True); "
        "save_file({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[2])"
    )
    loaded = runs / "loaded.safetensors"
    proc = subprocess.run([sys.executable, "-c", script, str(fsdp2), str(loaded)], env=ENV, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = load_file(loaded)
    ref = load_file(one / "model.safetensors")
    assert sorted(ref) == sorted(p0) and all(torch.equal(state[k], p0[k]) for k in p0)
    # and convert.py to-nanochat reads it (its main, in this process): nanochat's model file holds the same weights
    out = runs / "base" / "mid_checkpoints" / "d2"
    assert load_script("convert").main(["to-nanochat", "--model", str(fsdp2), "--output", str(out)]) == 0
    (model_file,) = out.glob("model_*.pt")
    nanochat = torch.load(model_file, map_location="cpu", weights_only=True)
    assert "lm_head.weight" in nanochat and _worst({k: nanochat[k] for k in p0 if k in nanochat}, p0) < 1e-5


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc", [2, 1])
def test_a_fsdp2_checkpoint_resumes(runs, nproc):
    """Saved at step 3 by 2 FSDP2 processes, resumed on 2 FSDP2 processes (the same bits: the same operations) and
    on 1 plain process (its 2 data shards dealt to it, the state re-sharded: float32 summation order)."""
    full, resumed = runs / "fsdp2", runs / f"resumed{nproc}"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-3", resumed / "checkpoint-3")
    _launch(runs, resumed, nproc, [*(FSDP2 if nproc == 2 else ()), "--resume_from_checkpoint", "true"])
    got, expected = _losses(resumed), _losses(full)
    a, b = load_file(resumed / "model.safetensors"), load_file(full / "model.safetensors")
    if nproc == 2:
        assert got == expected and all(torch.equal(a[k], b[k]) for k in b)
    else:
        assert got == [pytest.approx(e, rel=1e-5) for e in expected]
        assert _worst(a, b) < 1e-5


@pytest.mark.parametrize(
    "env, flags, words",
    [
        ({}, [], "fully_shard=true needs several processes"),
        ({"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, [], "fully_shard=true together with Accelerate's FSDP"),
        ({"WORLD_SIZE": "2"}, ["--embedding_dtype", "bfloat16"], "embedding_dtype=bfloat16 with fully_shard=true"),
    ],
)
def test_fully_shard_refused_where_it_makes_no_sense(monkeypatch, env, flags, words):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError, match=words) as e:
        parse_args([*FSDP2, "--device_batch_size", "1", "--max_seq_len", "64", "--total_batch_size", "128", *flags])
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_preempts_a_fsdp2_run_and_it_resumes(tmp_path):
    """SIGTERM to `accelerate launch` of 2 FSDP2 processes: a complete checkpoint at the step both stop after, the
    one line, exit non-zero and no final model; resumed on 2 FSDP2 processes it finishes the run."""
    from mp_launch import PREEMPT_STEPS, assert_preempted, launch_command

    out = tmp_path / "run"
    # one micro-batch per step (accumulation is the other tests')
    short = ["--num_iterations", PREEMPT_STEPS, "--save_steps", "0", "--eval_every", "1000", "--spelling_eval_rows",
             "0", "--total_batch_size", "256"]  # fmt: skip
    args = [*RUN, *FSDP2, *short, "--output_dir", str(out)]
    assert_preempted([*launch_command(2, str(REPO / "scripts" / "mid_train.py")), *args], tmp_path, out, timeout=300)
    _launch(tmp_path, out, 2, [*FSDP2, *short, "--resume_from_checkpoint", "true"])
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h["step"] for h in history if "lrm" in h]
    assert steps == list(range(1, int(PREEMPT_STEPS) + 1)) and (out / "model.safetensors").is_file()
