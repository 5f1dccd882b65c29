"""A short `scripts/mid_train.py` run writes a model that a fresh process loads and generates with."""

import io
import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Spell the word: cat"}], add_generation_prompt=True,
                              return_dict=True, return_tensors="pt")["input_ids"]
assert tok.convert_ids_to_tokens(ids[0, -1].item()) == "<|assistant_start|>"
out = model.generate(ids, max_new_tokens=8, do_sample=False)
print("GENERATED", out.shape[1] - ids.shape[1], type(model).__name__)
"""


def test_short_run_writes_loadable_model(pushed_run):
    """conftest.py's `pushed_run` (4 steps in a fresh process; its pushes are test_hub.py's)."""
    proc, out, tmp_path = pushed_run.proc, pushed_run.out, pushed_run.tmp
    # nanochat's per-step line, the final summary
    assert "step 00004/00004 (100.00%) | loss:" in proc.stdout and "| lrm: " in proc.stdout
    assert "4/4 [" not in proc.stdout + proc.stderr  # no training bar when the output goes to files
    assert "validation bpb:" in proc.stdout and "SimpleSpelling exact match:" in proc.stdout
    assert "sample chat:" in proc.stdout
    for name in (
        "model.safetensors",
        "config.json",
        "modeling_nanochat_gpt.py",
        "configuration_nanochat_gpt.py",
        "tokenizer.json",
        "generation_config.json",
        "README.md",
        "report.md",
        "training_curves.png",
    ):
        assert (out / name).is_file(), name
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_nanochat_gpt.NanoChatGPTForCausalLM"
    card = (out / "README.md").read_text()
    assert "steps: 4" in card and "final validation bits per byte" in card and "from_pretrained" in card
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"

    load = subprocess.run(
        [sys.executable, "-c", LOAD, str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert load.returncode == 0, load.stderr[-3000:]
    assert "GENERATED" in load.stdout and "NanoChatGPTForCausalLM" in load.stdout


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("bar", [True, False])
def test_console_bar_and_lines_never_share_a_line(tmp_path, tiny_args, monkeypatch, bar):
    """A dry run (with a save every step) says what it did on the console, the training bar on stderr only, and
    writes nothing."""
    from nanochat_hf.training.run import main

    out, err = _Terminal(), _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    metrics = main(
        [
            *tiny_args,
            "--num_iterations",
            "3",
            "--save_steps",
            "1",
            "--spelling_eval_rows",
            "0",
            "--dry_run",
            "true",
            "--disable_tqdm",
            str(not bar).lower(),
            "--output_dir",
            str(tmp_path / "o"),
        ]
    )
    assert metrics["steps"] == 3 and metrics["val_bpb"] > 0
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    lines = out.getvalue().splitlines()
    steps = [line for line in lines if "| lrm: " in line]
    assert len(steps) == 3 and all(line.startswith("step 0000") for line in steps)
    assert "it/s]" not in out.getvalue() and "3/3 [" not in out.getvalue()  # the bar is never on stdout
    assert ("3/3 [" in err.getvalue()) == bar  # the training bar (stderr) only when asked for


def test_non_finite_loss_stops_the_run(tmp_path, capsys):
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.training.run import main

    tok = demo_tokenizer()
    model = NanoChatGPTForCausalLM(
        NanoChatGPTConfig(vocab_size=len(tok), n_layer=1, n_head=1, n_kv_head=1, n_embd=64, sequence_len=64)
    )
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    src = tmp_path / "nan-model"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "--model_source",
                str(src),
                "--max_seq_len",
                "64",
                "--device_batch_size",
                "2",
                "--total_batch_size",
                "128",
                "--num_iterations",
                "3",
                "--save_steps",
                "1",
                "--eval_every",
                "2",
                "--eval_tokens",
                "256",
                "--disable_tqdm",
                "true",
                "--output_dir",
                str(out),
            ]
        )
    assert exc.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mid_train: error:")]
    assert errors == [
        "mid_train: error: the training loss is nan at step 1 (the model diverged); no final model was written"
    ]
    assert not (out / "model.safetensors").exists() and not list(out.glob("checkpoint-*"))


def test_best_checkpoint_is_kept_and_loaded(tmp_path, tiny_args):
    from safetensors.torch import load_file

    from nanochat_hf.training.run import main

    out = tmp_path / "out"
    main(
        [
            *tiny_args,
            "--num_iterations",
            "6",
            "--eval_every",
            "2",
            "--save_steps",
            "2",
            "--spelling_eval_rows",
            "0",
            "--load_best_model_at_end",
            "true",
            "--metric_for_best_model",
            "val_bpb",
            "--save_total_limit",
            "1",
            "--output_dir",
            str(out),
        ]
    )
    state = json.loads((out / "trainer_state.json").read_text())
    evals = {h["step"]: h["eval_val_bpb"] for h in state["log_history"] if "eval_val_bpb" in h and h["step"] > 0}
    best_step = min(evals, key=evals.get)
    assert state["best_model_checkpoint"] == str(out / f"checkpoint-{best_step}")
    assert (out / f"checkpoint-{best_step}" / "optimizer.rank0.safetensors").is_file()
    final, best = (
        load_file(str(out / "model.safetensors")),
        load_file(str(out / f"checkpoint-{best_step}" / "model.safetensors")),
    )
    assert all(torch.equal(final[k], best[k]) for k in best)  # load_best_model_at_end: the best is the final model
