"""Bad configuration fails fast: one clear `mid_train: error:` line, no traceback, nothing trained or written."""

import pytest
from torch._inductor import config as inductor_config

from nanochat_hf.training.run import main


def _fails(argv, capsys, tmp_path, *expected):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--output_dir", str(out), "--report_to", "none"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("mid_train: error:")]
    assert len(lines) == 1, err
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


def test_removed_demo_n_embd_is_refused(capsys, tmp_path):
    """The demo width follows demo_depth now: an old config or flag setting it stops with one line saying so."""
    _fails(["--demo_n_embd", "64"], capsys, tmp_path, "demo_n_embd", "64*demo_depth")
    cfg = tmp_path / "old.yaml"
    cfg.write_text("model_source: demo\ndemo_depth: 2\ndemo_n_embd: 128\n")
    _fails([str(cfg)], capsys, tmp_path, str(cfg), "demo_n_embd", "64*demo_depth")


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
