import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCardData

from nanochat_hf.evaluation import (
    ChatCORE,
    TaskScore,
    categorical_outcomes,
    chatcore,
    generative_replies,
    load_problems,
    model_index_results,
    results_table,
    run_chat_eval,
    write_report_section,
)
from nanochat_hf.tasks import EVAL_TASKS
from nanochat_hf.tokenizer import render_for_completion

ROOT = Path(__file__).resolve().parents[2]


def test_categorical_compares_only_the_answer_letters(tokenizer, random_model, data_files):
    problems = load_problems(EVAL_TASKS["ARC-Easy"], data_files["ARC-Easy"])
    outcomes = categorical_outcomes(random_model, tokenizer, problems, batch_size=3)  # left-padded batches
    expected = []
    with torch.no_grad():  # by hand: one full forward per problem, letter logits at the last position
        for p in problems:
            logits = random_model(torch.tensor([render_for_completion(tokenizer, {"messages": p.messages})])).logits
            letter_ids = [tokenizer.encode(c, add_special_tokens=False)[0] for c in p.letters]
            expected.append(p.letters[logits[0, -1, letter_ids].argmax()] == p.answer)
    assert outcomes == expected
    assert categorical_outcomes(random_model, tokenizer, problems, batch_size=1) == expected


def test_categorical_ignores_tokens_other_than_letters(tokenizer, wired, data_files):
    # the model's favourite token after <|assistant_start|> is "!", then B: every "B" problem is right
    model = wired(["<|assistant_start|>", "!"])
    with torch.no_grad():
        model.lm_head.weight[
            tokenizer.encode("B", add_special_tokens=False)[0], tokenizer.convert_tokens_to_ids("<|assistant_start|>")
        ] = 0.5
    (score,) = run_chat_eval(model, tokenizer, ["ARC-Easy"], data_files=data_files, batch_size=2)
    assert (score.task, score.mode, score.n) == ("ARC-Easy", "categorical", 4)
    assert score.accuracy == 0.5  # answers B, C, A, B


def test_generative_with_tool_use_and_checker(tokenizer, wired, data_files):
    # the model calls the calculator on 2+3, then writes "#### 5"; only the GSM8K problem whose answer is 5
    # is right. The checker reads the whole decoded completion, tool block included, as nanochat's chat_eval
    model = wired(
        ["<|assistant_start|>", "<|python_start|>", "2", "+", "3", "<|python_end|>"],
        ["<|output_end|>", "####", " ", "5", "<|assistant_end|>"],
    )
    problems = load_problems(EVAL_TASKS["GSM8K"], data_files["GSM8K"])
    replies = generative_replies(model, tokenizer, problems, batch_size=2, max_new_tokens=16)
    assert replies == ["<|python_start|>2+3<|python_end|><|output_start|>5<|output_end|>#### 5"] * 3
    (gsm, bee) = run_chat_eval(
        model,
        tokenizer,
        ["GSM8K", "SpellingBee"],
        max_problems=20,
        data_files=data_files,
        batch_size=4,
        max_new_tokens=16,
    )
    assert (gsm.accuracy, gsm.n) == (1 / 3, 3)
    bee_problems = load_problems(EVAL_TASKS["SpellingBee"], max_problems=20)
    assert bee.accuracy == sum(p.answer == "5" for p in bee_problems) / 20


def test_batched_generation_equals_one_by_one(tokenizer, random_model, data_files):
    problems = load_problems(EVAL_TASKS["GSM8K"], data_files["GSM8K"])
    batched = generative_replies(random_model, tokenizer, problems, batch_size=3, max_new_tokens=12)
    single = generative_replies(random_model, tokenizer, problems, batch_size=1, max_new_tokens=12)
    assert batched == single and len(set(batched)) > 1


def test_chatcore_table_and_metric():
    scores = [TaskScore("ARC-Easy", "categorical", 0.55, 0.25, 100), TaskScore("GSM8K", "generative", 0.1, 0.0, 50)]
    assert chatcore(scores) == pytest.approx(((0.55 - 0.25) / 0.75 + 0.1) / 2)
    table = results_table(scores)
    assert "| ARC-Easy | categorical | 0.5500 | 0.25 | 0.4000 | 100 |" in table
    assert table.endswith("ChatCORE (over 2 of 6 tasks): 0.2500")
    metric = ChatCORE()
    metric.add_batch(correct=[1, 1, 0, 0], task=["ARC-Easy", "ARC-Easy", "ARC-Easy", "GSM8K"])
    out = metric.compute()
    assert out["ARC-Easy/accuracy"] == pytest.approx(2 / 3) and out["GSM8K/accuracy"] == 0.0
    assert out["chatcore"] == pytest.approx((2 / 3 - 0.25) / 0.75 / 2)


def test_report_section_replaces_and_keeps_the_rest(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# Run\n\n## Training\n\nloss 1.0\n\n## Samples\n\nhi\n")
    os.chmod(report, 0o644)
    old = [TaskScore("MMLU", "categorical", 0.3, 0.25, 10)]
    new = [TaskScore("MMLU", "categorical", 0.4, 0.25, 10)]
    write_report_section(report, old)
    write_report_section(report, new)
    text = report.read_text()
    assert text.count("## Chat evaluation") == 1 and "0.4000" in text and "0.3000" not in text
    assert text.startswith("# Run\n\n## Training\n\nloss 1.0\n\n## Samples\n\nhi\n\n## Chat evaluation\n")
    assert oct(report.stat().st_mode & 0o777) == oct(0o644) and sorted(os.listdir(tmp_path)) == ["report.md"]


def test_model_index_metadata():
    scores = [
        TaskScore("ARC-Challenge", "categorical", 0.3, 0.25, 10),
        TaskScore("SpellingBee", "generative", 0.5, 0.0, 8),
    ]
    card = ModelCardData(model_name="you/nanochat-mid", eval_results=model_index_results(scores)).to_dict()
    (entry,) = card["model-index"]
    arc, bee = entry["results"]
    assert arc["dataset"] == {
        "name": "ARC-Challenge",
        "type": "allenai/ai2_arc",
        "config": "ARC-Challenge",
        "split": "test",
    }
    assert arc["metrics"][0]["type"] == "accuracy" and arc["metrics"][0]["value"] == 0.3
    assert bee["metrics"][0]["value"] == 0.5


def run_cli(*args, env_extra=None, launcher=()):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        **(env_extra or {}),
    }
    return subprocess.run(
        [*launcher, str(ROOT / "scripts" / "chat_eval.py"), *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture
def model_dir(tmp_path, tokenizer, random_model):
    random_model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.slow
def test_cli_in_a_fresh_process(model_dir, data_files, tmp_path, tokenizer, random_model):
    files = [f"--data_files={task}={paths[0]}" for task, paths in data_files.items()]
    proc = run_cli(
        "--model",
        str(model_dir),
        "--tasks",
        "ARC-Easy,MMLU,GSM8K,HumanEval",
        "--max_new_tokens",
        "8",
        "--batch_size",
        "2",
        "--report",
        str(tmp_path / "report.md"),
        "--json",
        str(tmp_path / "r.json"),
        *files,
        launcher=(sys.executable,),
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [(r["task"], r["n"]) for r in rows] == [("ARC-Easy", 4), ("MMLU", 3), ("GSM8K", 3), ("HumanEval", 1)]
    expected = run_chat_eval(random_model, tokenizer, ["ARC-Easy", "MMLU"], data_files=data_files, batch_size=2)
    assert [r["accuracy"] for r in rows[:2]] == [s.accuracy for s in expected]
    assert "| ARC-Easy | categorical |" in proc.stdout and "ChatCORE (over 4 of 6 tasks)" in proc.stdout
    assert "## Chat evaluation" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_give_the_single_process_results(model_dir, data_files, tmp_path, tokenizer, random_model):
    files = [f"--data_files={task}={paths[0]}" for task, paths in data_files.items()]
    proc = run_cli(
        "--model",
        str(model_dir),
        "--tasks",
        "ARC-Easy,MMLU,GSM8K",
        "--max_new_tokens",
        "8",
        "--json",
        str(tmp_path / "r.json"),
        *files,
        launcher=(
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(29600 + os.getpid() % 1000),
        ),  # gloo on CPU
        env_extra={"OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    single = run_chat_eval(
        random_model, tokenizer, ["ARC-Easy", "MMLU", "GSM8K"], data_files=data_files, max_new_tokens=8
    )
    assert [(r["task"], r["accuracy"], r["n"]) for r in rows] == [(s.task, s.accuracy, s.n) for s in single]
    assert proc.stdout.count("| ARC-Easy |") == 1  # printed by rank 0 only


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--tasks", "ARC"],
            "chat_eval: error: unknown chat-eval task 'ARC'; expected one of ARC-Easy, ARC-Challenge, MMLU, "
            "GSM8K, HumanEval, SpellingBee",
        ),
        (["--data_files", "GSM8K"], "chat_eval: error: --data_files 'GSM8K': expected TASK=FILE[,FILE]"),
        (["--data_files", "GSM8K=/nope.jsonl"], "chat_eval: error: --data_files: no such file /nope.jsonl"),
        (["--batch_size", "0"], "chat_eval: error: --max_problems, --batch_size and --max_new_tokens must be >= 1"),
    ],
)
def test_bad_arguments_are_one_line(args, message, model_dir, capsys, load_script):
    assert load_script("chat_eval").main(["--model", str(model_dir), *args]) == 2
    assert capsys.readouterr().err == message + "\n"
