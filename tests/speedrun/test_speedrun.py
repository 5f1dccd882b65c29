"""scripts/speedrun.py: the real chain (every stage's script, at the smallest sizes), its report and model cards,
a re-run that skips every finished stage, a failing stage and the re-run that resumes there, a training stage
resumed from its checkpoint, the final model answering chat.py, and the one-line bad-input cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from nanochat_hf import speedrun as sr

STAGES = ["data", "tokenizer", "tok_eval", "base", "base_eval", "sft", "chat_eval"]
# the demo's chain, smaller still: every stage's real script runs, each for seconds
TINY = dict(num_shards=2, docs_per_shard=300, vocab_size=512, max_chars=200_000, depth=1, base_steps=4, save_every=2,
            sft_steps=3, core_rows=4, chat_problems=2, rl_rows=4, rl_eval=1, rl_tokens=12)  # fmt: skip


@pytest.fixture(scope="module")
def tiny():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in TINY.items():
            mp.setitem(sr.DEMO, key, value)
        yield


def chain(run_dir: Path, rl: bool = False) -> Path:
    argv = ["--demo", "--run_dir", str(run_dir), *(["--rl"] if rl else [])]
    return sr.speedrun(argv, run_dir=run_dir, demo=True, gpus=1, rl=rl)


@pytest.fixture(scope="module")
def demo_run(tiny, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("speedrun") / "run"
    chain(run_dir)
    return run_dir


def marker(run_dir: Path, folder: str) -> dict:
    return json.loads((run_dir / folder / sr.MARKER).read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
def test_report_has_every_stage_with_its_numbers_and_time(demo_run):
    report = (demo_run / "report.md").read_text()
    summary, stages = report.split("## Summary")[1].split("## Stages")
    table = [line for line in stages.splitlines() if line.startswith("| ") and "---" not in line]
    rows = {line.split("|")[1].strip(): line for line in table}
    core = json.loads((demo_run / "base_eval" / "core.json").read_text())
    assert f"| CORE | {round(core['core_metric'], 4)} | - |" in summary  # nanochat's summary: BASE, SFT columns
    assert "| Metric | BASE | SFT |" in summary and "| ChatCORE | - |" in summary
    assert [r for r in rows if r != "stage"] == STAGES
    assert "ratio climbmix-val" in rows["tok_eval"] and "vocab_size 512" in rows["tokenizer"]
    assert "val bpb" in rows["base"] and "tokens 16384" in rows["base"]  # 4 steps x 4,096 tokens
    assert "CORE" in rows["base_eval"] and "train bpb" in rows["base_eval"] and "val bpb" in rows["sft"]
    assert "| train bpb | " in summary
    assert "SpellingBee" in rows["chat_eval"] and "ChatCORE" in rows["chat_eval"]
    assert all(marker(demo_run, f)["seconds"] > 0 for f in ("tokenizer", "base", "sft"))
    assert marker(demo_run, "base_eval")["metrics"]["CORE"] == round(core["core_metric"], 4)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_every_model_folder_has_a_card_with_stage_tokens_scores_and_command(demo_run):
    for folder, score in (("tokenizer", "tok_eval"), ("base", "CORE"), ("sft", "ChatCORE")):
        card = ModelCard.load(demo_run / folder / "README.md")
        assert {"nanochat", "nanochat-speedrun", folder} <= set(card.data.tags)
        assert f"## Speedrun stage: {folder}" in card.text and score in card.text
        assert marker(demo_run, folder)["command"] in card.text
    assert "tokens seen: 16,384 (4 steps)" in (demo_run / "base" / "README.md").read_text()
    sft = ModelCard.load(demo_run / "sft" / "README.md")
    assert "- mixture:" in sft.text and "mid-training" in sft.data.tags  # mid_train's own card is kept
    assert [r.dataset_name for r in sft.data.eval_results] == ["SpellingBee"]  # the chat scores, as model-index


@pytest.mark.slow
@pytest.mark.multiprocess
def test_rerun_skips_every_finished_stage(demo_run, capsys, monkeypatch):
    def no_command(*a, **k):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(sr, "run_command", no_command)
    before = (demo_run / "base" / "model.safetensors").stat().st_mtime_ns
    chain(demo_run)
    out = capsys.readouterr().out
    assert all(f"{name}: done before" in out for name in STAGES)
    assert (demo_run / "base" / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_failing_stage_stops_the_chain_and_the_same_command_resumes_there(demo_run, capsys):
    (demo_run / "chat_eval" / sr.MARKER).unlink()
    scores = demo_run / "chat_eval" / "scores.json"
    scores.unlink()
    scores.mkdir()  # chat_eval refuses a --json it cannot write: the stage fails
    with pytest.raises(sr.StageFailed) as e:
        chain(demo_run)
    line = str(e.value)
    assert "\n" not in line and line.startswith("stage chat_eval failed: exit code 2")
    assert "run the same command again" in line and "scripts/speedrun.py --demo --run_dir" in line
    assert all((demo_run / f / sr.MARKER).is_file() for f in ("tokenizer", "base", "sft"))
    assert (demo_run / "sft" / "model.safetensors").is_file()
    scores.rmdir()
    capsys.readouterr()
    chain(demo_run)
    out = capsys.readouterr().out
    assert "sft: done before" in out and "[7/7] chat_eval (chat_eval)" in out
    assert marker(demo_run, "chat_eval")["metrics"]["SpellingBee"] is not None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_interrupted_training_stage_resumes_its_checkpoint(demo_run, capsys):
    # as after a crash mid-way: no record, the final model not written, checkpoints there
    (demo_run / "base" / sr.MARKER).unlink()
    (demo_run / "base" / "model.safetensors").unlink()
    assert (demo_run / "base" / "checkpoint-4" / "trainer_state.json").is_file()
    chain(demo_run)
    out = capsys.readouterr().out
    assert "base: resuming its newest checkpoint" in out and "--resume_from_checkpoint true" in out
    assert (demo_run / "base" / "model.safetensors").is_file()
    assert marker(demo_run, "base")["metrics"]["steps"] == 4
    assert "base_eval: done before" in out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_final_model_answers_chat(demo_run, load_script, capsys):
    """chat.py's main in this process (a fresh chat.py process answering: tests/inference/test_chat_cli.py)."""
    argv = ["--model", str(demo_run / "sft"), "--prompt", "Spell the word: apple", "--temperature", "0"]
    code = load_script("chat").main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert out.strip()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_rl_when_asked_runs_after_the_chain_and_reports_pass_at_k(demo_run, capsys):
    chain(demo_run, rl=True)
    out = capsys.readouterr().out
    assert "chat_eval: done before" in out and "[8/8] rl (chat_rl (GSM8K))" in out
    metrics = marker(demo_run, "rl")["metrics"]
    assert metrics["steps"] == 1 and 0 <= metrics["pass@1"] <= 1  # 4 demo problems, 4 per step
    assert "| Metric | BASE | SFT | RL |" in (demo_run / "report.md").read_text()
    assert "## Speedrun stage: rl" in (demo_run / "rl" / "README.md").read_text()


# ---- one line each, nothing started ---------------------------------------------------------------------------


def test_bad_gpus_is_one_line(load_script, capsys, tmp_path):
    assert load_script("speedrun").main(["--demo", "--gpus", "0", "--run_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "speedrun: error: --gpus 0: expected a positive number of processes"
    assert not (tmp_path / "r").exists()


def test_a_run_folder_of_other_settings_is_refused(load_script, capsys, tmp_path):
    (tmp_path / sr.SETTINGS_FILE).write_text(json.dumps({"demo": False}))
    assert load_script("speedrun").main(["--demo", "--run_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"speedrun: error: {tmp_path / sr.SETTINGS_FILE}: this run folder was started with demo=")
    assert "\n" not in err and json.loads((tmp_path / sr.SETTINGS_FILE).read_text()) == {"demo": False}


def test_offline_without_shards_fails_at_the_data_stage(load_script, capsys, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert load_script("speedrun").main(["--run_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedrun: error: stage data failed: ") and "HF_HUB_OFFLINE is set" in err
    assert "run the same command again to resume at data" in err and "\n" not in err
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [sr.SETTINGS_FILE]
