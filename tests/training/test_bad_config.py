"""Bad configuration fails fast: one clear `mid_train: error:` line, no traceback, nothing trained or written."""

import os
import subprocess
import sys

import pytest
from torch._inductor import config as inductor_config

from nanochat_hf.training.run import main

from .conftest import REPO_ROOT


def _fails(argv, capsys, tmp_path, *expected):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--output_dir", str(out), "--report_to", "none"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    lines = [line for line in err if line.startswith("mid_train: error:")]
    assert len(lines) == 1, err
    assert not captured.out.strip(), captured.out  # the refusal is the run's one line (checks come before the report)
    assert "Traceback" not in "\n".join(err)
    for word in expected:
        assert word in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_indivisible_batch(capsys, tmp_path):
    _fails(
        ["--device_batch_size", "3", "--max_seq_len", "64", "--total_batch_size", "1000"],
        capsys,
        tmp_path,
        "total_batch_size=1000",
        "3*64*1 = 192",
    )


def test_unknown_model_source(capsys, tmp_path):
    _fails(["--model_source", str(tmp_path / "nowhere" / "x" / "y")], capsys, tmp_path, "model_source=", "nowhere")


def test_unknown_yaml_key(capsys, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("device_batch_size: 4\nlearning_rat: 0.1\n")
    with pytest.raises(SystemExit):
        main([str(cfg)])
    assert "unknown argument(s) learning_rat" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    def make(vocab, with_tokenizer):
        d = tmp_path_factory.mktemp(f"hf{vocab}")
        NanoChatGPTForCausalLM(
            NanoChatGPTConfig(vocab_size=vocab, n_layer=1, n_head=1, n_kv_head=1, n_embd=64, sequence_len=64)
        ).save_pretrained(d)
        if with_tokenizer:
            from nanochat_hf.data import demo_tokenizer

            demo_tokenizer().save_pretrained(d)
        return d

    return make


def test_vocab_mismatch(capsys, tmp_path, tiny_hf_dir):
    _fails(["--model_source", str(tiny_hf_dir(100, True))], capsys, tmp_path, "vocab", "100")


def test_missing_tokenizer(capsys, tmp_path, tiny_hf_dir):
    _fails(["--model_source", str(tiny_hf_dir(4096, False))], capsys, tmp_path, "tokenizer")


def test_nanochat_dir_without_tokenizer(capsys, tmp_path):
    base = tmp_path / "nanochat"
    ckpt = base / "base_checkpoints" / "d1"
    ckpt.mkdir(parents=True)
    (ckpt / "model_000010.pt").write_bytes(b"")
    (ckpt / "meta_000010.json").write_text("{}")
    _fails(["--model_source", str(base)], capsys, tmp_path, "tokenizer")


def test_unknown_flag(capsys, tmp_path):
    _fails(["--demo_width", "64"], capsys, tmp_path, "unrecognized arguments: --demo_width 64")


def test_compile_without_a_cpp_compiler(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(inductor_config.cpp, "cxx", (str(tmp_path / "no-such-c++"),))
    _fails(
        ["--torch_compile", "true", "--num_iterations", "1"],
        capsys,
        tmp_path,
        "torch_compile=true",
        "C++ compiler",
        "--torch_compile false",
    )


def test_mixture_smaller_than_one_step_is_refused_instead_of_cycled(capsys, tmp_path):
    from .conftest import TINY_ARGS

    mixture = tmp_path / "tiny.yaml"
    mixture.write_text(
        "train:\n  tasks:\n    - {task: simple_spelling, split: train, size: 2, words: demo}\n"
        "val:\n  tasks:\n    - {task: simple_spelling, split: test, size: 2, words: demo}\n"
    )
    _fails(
        [*TINY_ARGS, "--train_mixture", str(mixture), "--val_mixture", str(mixture), "--num_iterations", "4"],
        capsys,
        tmp_path,
        "train mixture too small",
        "its rows would be repeated within a step",
    )
    assert not (tmp_path / "out").exists()  # made for the run, removed with the refusal


def test_a_bad_flag_value_reads_the_same_way(capsys, tmp_path):
    _fails(["--device_batch_size", "many"], capsys, tmp_path, "argument --device_batch_size", "'many'", "--help")


def test_other_ranks_exit_the_same_without_a_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # rank 0 says it; every rank exits with 2
    for argv in (["--device_batch_size", "0"], ["--device_batch_size", "many"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
        assert exc.value.code == 2
        assert capsys.readouterr().err == ""


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """Only bad input becomes one line: an error of ours (here a RuntimeError in setup) reaches the user whole."""
    from nanochat_hf.training import run

    def broken(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(run, "setup", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["--output_dir", str(tmp_path / "out")])


@pytest.mark.slow
def test_bad_config_in_a_fresh_process(tmp_path):
    """Slow: what is tested is a fresh `python scripts/mid_train.py` (exit code 2, stderr exactly one line), which
    imports torch and transformers before it validates (seconds); the in-process cases above are the quick ones."""
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "mid_train.py"), "--device_batch_size", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == "mid_train: error: device_batch_size=0 must be a positive integer\n", proc.stderr
