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
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Spell the word: cat"}], add_generation_prompt=True,
                              return_dict=True, return_tensors="pt")["input_ids"]
print("GENERATED", model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] - ids.shape[1])
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


@pytest.fixture(scope="module", params=[1, 2])
def full_run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"sft{request.param}")
    proc = _launch(tmp, tmp / "full", request.param)
    return request.param, tmp, tmp / "full", proc


def test_trains_one_epoch_and_loads(full_run):
    nproc, tmp, out, _ = full_run
    steps = _steps(out)
    assert len(steps) >= 8 and [s for s, *_ in steps] == list(range(1, len(steps) + 1))
    lrm = [x[3] for x in steps]
    assert lrm[0] == 1.0 and lrm[-1] < 0.15 and lrm == sorted(lrm, reverse=True)  # linear decay over the last half
    assert sum(m == 1.0 for m in lrm) >= len(lrm) // 2 - 1
    assert steps[-1][2] < steps[0][2]  # it learns
    if nproc == 2:
        p0, p1 = (load_file(str(out / f"params.rank{r}.safetensors")) for r in (0, 1))
        assert all(torch.equal(p0[k], p1[k]) for k in p0)
    load = subprocess.run(
        [sys.executable, "-c", LOAD, str(out)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert load.returncode == 0 and "GENERATED" in load.stdout, load.stderr[-3000:]


def test_resume_reproduces_logged_losses(full_run):
    nproc, tmp, full, _ = full_run
    resumed = tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")  # as if the run died after step 4
    _launch(tmp, resumed, nproc, ["--resume_from_checkpoint", "true"])
    assert _steps(resumed) == _steps(full)
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
