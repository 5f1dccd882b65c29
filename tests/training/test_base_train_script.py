"""base_train's script in-process (`base_run.main`) on synthetic shards and HEAD's tiny tokenizer: the run, its
folder (an ordinary Hugging Face model with base_train's meta), resume, and bad input in one line (a full disk,
SIGTERM, a tokenizer without BOS, no tokenizer, depth 0, a batch that does not divide)."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import shutil

import pytest
from transformers import AutoModelForCausalLM

from nanochat_hf.data.pretraining import write_synthetic_shards
from nanochat_hf.training.base_run import main

from .base_replay import DATA
from .conftest import checkpoint_requested_at

pytestmark = pytest.mark.slow  # a few short runs of the script (about 30 s together)

TINY = [
    "--depth=2", "--aspect_ratio=16", "--head_dim=16", "--max_seq_len=64", "--device_batch_size=2",
    "--total_batch_size=256", "--num_iterations=4", "--warmup_steps=1", "--eval_every=2", "--eval_tokens=256",
    "--core_metric_every=-1", "--sample_every=-1", "--torch_compile=false", "--disable_tqdm=true", "--num_threads=1",
]  # fmt: skip


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


def _fail(argv: list[str], capsys, code: int | None = None) -> str:
    """main(argv) exits non-zero with one line on stderr; returns it."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code not in (0, None) and (code is None or e.value.code == code)
    assert len(err) == 1 and err[0].startswith("base_train: "), err
    return err[0]


def _losses(folder) -> list:
    return [h["loss"] for h in json.loads((folder / "trainer_state.json").read_text())["log_history"] if "lrm" in h]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("base_script")
    shards = tmp / "base_data_climbmix"
    write_synthetic_shards(shards, 3, 80, row_group_size=20)
    args = [*TINY, "--data_dir", str(shards), "--tokenizer_dir", str(DATA / "base_train_tokenizer")]
    out = tmp / "run"
    stdout = _run([*args, "--save_every=2", "--output_dir", str(out)])
    return tmp, out, args, stdout


def test_run_prints_the_plan_and_writes_a_hf_folder(run):
    _, out, _, stdout = run
    assert "base_train: parameters: wte 10,240, value_embeds 10,240, lm_head 10,240" in stdout
    assert "base_train: batch: 256 tokens = 2 x 64 x 1 processes x 2 accumulation steps" in stdout
    assert "step 00004/00004" in stdout and "| eta: " in stdout
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.n_layer == 2 and model.config.n_embd == 32
    meta = json.loads((out / "nanochat_meta.json").read_text())
    assert meta["step"] == 4 and meta["user_config"]["depth"] == 2 and meta["total_batch_size"] == 256
    assert set(meta["dataloader_state_dict"]) == {"pq_idx", "rg_idx", "epoch"}


def test_resume_continues_from_the_saved_data_position(run):
    """As HEAD's loader resumes: the next round of row groups after the saved one, an empty buffer (so the rows after
    a resume are not the uninterrupted run's: HEAD's approximate resume); the log and loss EMA carry on."""
    tmp, out, args, _ = run
    resumed = tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    _run([*args, "--output_dir", str(resumed), "--resume_from_step=2"])
    assert _losses(resumed)[:2] == _losses(out)[:2] and len(_losses(resumed)) == 4
    saved = json.loads((out / "checkpoint-2" / "data_state.rank0.json").read_text())
    final = json.loads((resumed / "nanochat_meta.json").read_text())["dataloader_state_dict"]
    assert (final["epoch"], final["pq_idx"], final["rg_idx"]) > (saved["epoch"], saved["pq_idx"], saved["rg_idx"])


@contextlib.contextmanager
def _file_size_limit(nbytes: int):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_full_disk_while_saving_is_one_line(run, capsys):
    tmp, out, args, _ = run
    full = tmp / "full"
    full.mkdir()
    shutil.copytree(out / "checkpoint-2", full / "checkpoint-2")
    with _file_size_limit(100_000):  # the tiny model's weights are about 250 kB
        line = _fail([*args, "--save_every=2", "--output_dir", str(full), "--resume_from_step=2"], capsys, code=1)
    assert line.startswith(f"base_train: error: checkpoint checkpoint-4 could not be saved in {full}: "), line
    assert sorted(p.name for p in full.iterdir()) == ["checkpoint-2"]


def test_sigterm_saves_says_where_and_exits_143(run, monkeypatch, capsys):
    from nanochat_hf.training import base_run

    tmp, out, args, _ = run
    checkpoint_requested_at(monkeypatch, base_run, 2)
    stopped = tmp / "sigterm"
    line = _fail([*args, "--output_dir", str(stopped)], capsys, code=143)
    assert line.startswith(f"base_train: preempted (SIGTERM) at step 3 of 4: {stopped / 'checkpoint-3'} is saved")
    assert "--resume_from_checkpoint true" in line and not (stopped / "model.safetensors").exists()
    monkeypatch.undo()
    _run([*args, "--output_dir", str(stopped), "--resume_from_checkpoint", "true"])
    assert _losses(stopped)[:3] == _losses(out)[:3] and len(_losses(stopped)) == 4


def test_bad_input_is_one_line(run, tmp_path, capsys):
    _, _, args, _ = run
    line = _fail([*args, "--depth=0", "--output_dir", str(tmp_path / "o")], capsys, code=2)
    assert line == "base_train: error: depth=0: expected a positive number of layers"
    line = _fail([*args, "--total_batch_size=200", "--output_dir", str(tmp_path / "o")], capsys, code=2)
    assert "total_batch_size=200 is not divisible by device_batch_size*max_seq_len*world_size" in line
    line = _fail([*args, "--tokenizer_dir", str(tmp_path), "--output_dir", str(tmp_path / "o")], capsys, code=2)
    assert line.startswith(f"base_train: error: {tmp_path}: no tokenizer (tokenizer.json")
    nobos = tmp_path / "nobos"
    shutil.copytree(DATA / "base_train_tokenizer", nobos)
    text = (nobos / "tokenizer.json").read_text().replace("<|bos|>", "<|start|>")
    (nobos / "tokenizer.json").write_text(text)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (nobos / name).exists():
            (nobos / name).write_text((nobos / name).read_text().replace("<|bos|>", "<|start|>"))
    line = _fail([*args, "--tokenizer_dir", str(nobos), "--output_dir", str(tmp_path / "o")], capsys, code=2)
    assert (
        line
        == f"base_train: error: {nobos}: the tokenizer has no <|bos|> token, which nanochat puts before every document"
    )
    assert not (tmp_path / "o").exists()


def test_sft_starts_from_the_folder(run):
    """mid_train's SFT recipe takes the folder as --model_source and inherits its batch settings and LRs from
    base_train's meta (as HEAD's chat_sft.py from a base checkpoint)."""
    from nanochat_hf.training.run import main as mid_train

    tmp, out, _, _ = run
    sft = tmp / "sft"
    argv = ["--model_source", str(out), "--inherit_from_base", "true", "--optimizer_recipe", "2026-07"]
    argv += ["--packing", "bestfit", "--completion_only_loss", "true", "--load_optimizer", "false"]
    argv += ["--num_iterations", "2", "--eval_every", "-1", "--eval_tokens", "256", "--spelling_eval_rows", "0"]
    argv += ["--chat_eval_tasks", "", "--torch_compile", "false", "--disable_tqdm", "true", "--output_dir", str(sft)]
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = mid_train(argv)
    assert metrics["steps"] == 2
    saved = json.loads((sft / "training_args.json").read_text())
    assert (saved["max_seq_len"], saved["device_batch_size"], saved["total_batch_size"]) == (64, 2, 256)
    assert saved["embedding_lr"] == 0.3 and saved["unembedding_lr"] == 0.008  # base_train's, from its user_config
