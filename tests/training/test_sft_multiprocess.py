"""nanochat HEAD's SFT recipe (configs/sft_demo.yaml, shrunk) under `accelerate launch` on CPU: 1 and 2
processes train one best-fit epoch, resume with identical losses, and write a model AutoModelForCausalLM loads."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from mp_launch import MP_ARGS, launch_mid_train  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[2]
MIXTURE = """
train:
  tasks:
    - {task: simple_spelling, split: train, size: 50, words: demo}
    - {task: arithmetic, split: train, size: 20}
    - {task: multiple_choice, split: train, size: 10}
val:
  tasks:
    - {task: simple_spelling, split: test, size: 20, words: demo}
"""
RUN = ["--demo_depth", "2", *MP_ARGS, "--save_steps", "4", "--eval_every", "4"]
LOAD = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
for folder in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "Spell the word: cat"}], add_generation_prompt=True,
                                  return_dict=True, return_tensors="pt")["input_ids"]
    print("GENERATED", folder, model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] - ids.shape[1])
"""


def _launch(tmp: Path, out: Path, nproc: int, extra=()):
    mixture = tmp / "mix.yaml"
    mixture.write_text(MIXTURE)
    config = str(REPO / "configs" / "sft_demo.yaml")
    args = [config, *RUN, "--train_mixture", str(mixture), "--val_mixture", str(mixture), "--output_dir", str(out)]
    return launch_mid_train([*args, *extra], tmp, nproc, timeout=400)


def _steps(out: Path):
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"], h["train_loss_mean"], h["lrm"]) for h in history if "lrm" in h]


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory) -> dict:
    """{nproc: (the folder it ran in, its output folder)} of the 1- and 2-process runs."""
    runs = {}
    for nproc in (1, 2):
        tmp = tmp_path_factory.mktemp(f"sft{nproc}")
        out = tmp / f"full{nproc}"  # names apart: the loading process imports each folder's remote code by its name
        _launch(tmp, out, nproc)
        runs[nproc] = tmp, out
    return runs


@pytest.fixture(scope="module")
def loaded(full_runs) -> str:
    """The output of one fresh process loading both runs' models (AutoModelForCausalLM, remote code) and generating."""
    folders = [str(out) for _, out in full_runs.values()]
    load = subprocess.run(
        [sys.executable, "-c", LOAD, *folders],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    return load.stdout


@pytest.fixture(params=[1, 2])
def full_run(request, full_runs):
    return request.param, *full_runs[request.param]


def test_trains_one_epoch_and_loads(full_run, loaded):
    nproc, tmp, out = full_run
    steps = _steps(out)
    assert len(steps) >= 8 and [s for s, *_ in steps] == list(range(1, len(steps) + 1))
    lrm = [x[3] for x in steps]
    assert lrm[0] == 1.0 and lrm[-1] < 0.15 and lrm == sorted(lrm, reverse=True)  # linear decay over the last half
    assert sum(m == 1.0 for m in lrm) >= len(lrm) // 2 - 1
    assert steps[-1][2] < steps[0][2]  # it learns
    if nproc == 2:
        p0, p1 = (load_file(str(out / f"params.rank{r}.safetensors")) for r in (0, 1))
        assert all(torch.equal(p0[k], p1[k]) for k in p0)
    assert f"GENERATED {out} " in loaded, loaded


def test_resume_reproduces_logged_losses(full_run):
    nproc, tmp, full = full_run
    resumed = tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")  # as if the run died after step 4
    _launch(tmp, resumed, nproc, ["--resume_from_checkpoint", "true"])
    assert _steps(resumed) == _steps(full)
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
