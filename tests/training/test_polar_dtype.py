"""--polar_dtype: once its checks pass, the run says which dtype Muon orthogonalises in and why (a refusal is its
one line, without it), the trainer's optimizer uses it, and a pinned bfloat16 the device cannot multiply stops the
run in one line before anything is written. The tests that build the demo run's trainer (its data, tokenizer and
model: seconds) are `slow`; the refusals stop before any of that and stay in the quick loop."""

import pytest

from nanochat_hf.training.run import build_trainer, main, setup


def _stops(argv, capsys, tmp_path):
    """Run main until it stops on bad input (a model source that does not exist, or the given error)."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--output_dir", str(out), "--report_to", "none"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("mid_train: error:")]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err
    assert not out.exists()
    return captured.out.splitlines(), errors[0]


def _says(argv, capsys, tmp_path):
    """The set-up's line about Muon's dtype, once every argument, file and source has passed its checks."""
    build_trainer(*setup([*argv, "--dry_run", "true", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]))
    return next(line for line in capsys.readouterr().out.splitlines() if "orthogonalises" in line)


@pytest.mark.slow
def test_auto_picks_float32_where_bfloat16_is_emulated(emulated_bfloat16, capsys, tmp_path, tiny_args):
    line = _says(tiny_args, capsys, tmp_path)
    assert line.startswith("mid_train: Muon orthogonalises in float32 (polar_dtype auto: a bfloat16 matrix product "), (
        line
    )
    assert "emulated" in line and "--polar_dtype bfloat16 gives nanochat's December numbers exactly" in line, line


@pytest.mark.slow
def test_a_pinned_dtype_is_said(capsys, tmp_path, tiny_args):
    line = _says([*tiny_args, "--polar_dtype", "float32"], capsys, tmp_path)
    assert line.startswith("mid_train: Muon orthogonalises in float32 (polar_dtype float32: pinned)"), line


@pytest.mark.slow
def test_a_pinned_bfloat16_says_it_is_slow_where_emulated(emulated_bfloat16, capsys, tmp_path, tiny_args):
    line = _says([*tiny_args, "--polar_dtype", "bfloat16"], capsys, tmp_path)
    assert line.startswith("mid_train: Muon orthogonalises in bfloat16 (polar_dtype bfloat16: pinned); slow here: "), (
        line
    )
    assert line.endswith(" (emulated), --polar_dtype auto runs float32"), line


def test_a_refused_source_prints_its_one_line_only(capsys, tmp_path):
    """Check first, then say what will run: a refusal does not print the dtype line before it."""
    out, error = _stops(["--model_source", str(tmp_path / "nowhere")], capsys, tmp_path)
    assert out == [] and "nowhere" in error, out


def test_pinned_bfloat16_the_device_cannot_multiply_is_one_line(capsys, tmp_path, tiny_args, no_bfloat16_products):
    with no_bfloat16_products:
        out, error = _stops([*tiny_args, "--polar_dtype", "bfloat16"], capsys, tmp_path)
    assert error == (
        "mid_train: error: polar_dtype=bfloat16: cpu cannot multiply bfloat16 matrices (bfloat16 matmul is not "
        "supported on this device); use auto or float32"
    )
    assert not any("orthogonalises" in line for line in out)


def test_bad_value_is_one_line(capsys, tmp_path):
    _, error = _stops(["--polar_dtype", "float16"], capsys, tmp_path)
    assert error == "mid_train: error: polar_dtype='float16': expected one of auto, bfloat16, float32"


@pytest.mark.slow
def test_the_trainer_optimizer_orthogonalises_in_the_pinned_dtype(tmp_path, tiny_args):
    """Recipe 2026-07 pinned to bfloat16 (its auto is float32 on every CPU): the flag reaches the optimizer."""
    argv = [*tiny_args, "--optimizer_recipe", "2026-07", "--polar_dtype", "bfloat16", "--dry_run", "true"]
    trainer = build_trainer(*setup([*argv, "--output_dir", str(tmp_path / "out")]))
    groups = trainer.create_optimizer().param_groups
    assert {g["polar_dtype"] for g in groups if g["kind"] == "muon"} == {"bfloat16"}
