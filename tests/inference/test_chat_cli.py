import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chat.py"
CHAINS = (
    ["<|assistant_start|>", "<|python_start|>", "2", "+", "3", "<|python_end|>", "?", "<|assistant_end|>"],
    ["<|output_end|>", " ", "!", "<|assistant_end|>"],
)


@pytest.fixture
def model_dir(tmp_path, tokenizer, wired):
    wired(*CHAINS).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_one_shot_in_a_fresh_process(model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(model_dir), "--prompt", "What is 2+3?", "--temperature", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "  [calculator] 2+3\n  [result] 5\n !\n"
    said = [line for line in proc.stderr.splitlines() if line.startswith("chat: ")]
    assert len(said) == 1 and " of them idle now (/proc/stat over " in said[0], proc.stderr


def test_repl_clear_and_quit(model_dir, monkeypatch, capsys, load_script):
    chat = load_script("chat")
    lines = iter(["hi", "again", "clear", "hi", "quit", "never read"])
    seen = []

    def fake_input(prompt=""):
        line = next(lines)
        seen.append(line)
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    assert chat.main(["--model", str(model_dir), "--temperature", "0", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert seen == ["hi", "again", "clear", "hi", "quit"]
    assert out.count("Assistant: \n  [calculator] 2+3\n  [result] 5\n !\n") == 3
    assert "(conversation cleared)" in out


def test_repl_ends_on_eof(model_dir, monkeypatch, capsys, load_script):
    chat = load_script("chat")

    def eof(prompt=""):
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    assert chat.main(["--model", str(model_dir), "--device", "cpu"]) == 0


def test_bad_model_dir_is_one_line_error(tmp_path, capsys, load_script):
    chat = load_script("chat")
    assert chat.main(["--model", str(tmp_path / "missing"), "--prompt", "hi"]) == 2
    assert capsys.readouterr().err == f"chat: error: --model {tmp_path / 'missing'}: no such model directory\n"
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "tokenizer.json").write_text("{}")
    (tmp_path / "damaged" / "config.json").write_text("{oops")
    assert chat.main(["--model", str(tmp_path / "damaged"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"chat: error: {tmp_path / 'damaged' / 'config.json'}: not valid JSON"), err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("requested", ["0", "10000"])
def test_a_thread_count_outside_one_to_the_cores_is_one_line(model_dir, capsys, load_script, requested):
    from nanochat_hf.training.device import usable_cores

    chat = load_script("chat")
    assert chat.main(["--model", str(model_dir), "--prompt", "hi", "--num-threads", requested]) == 2
    assert capsys.readouterr().err == (
        f"chat: error: --num-threads {requested}: expected 1 to {len(usable_cores())} (the CPU cores this "
        "process may use)\n"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--top-k", "-1"], "chat: error: --max-new-tokens must be >= 1, --temperature >= 0, --top-k >= 0\n"),
        (["--top-k", "many"], "chat: error: argument --top-k: invalid int value: 'many' (see --help)\n"),
    ],
)
def test_bad_arguments_in_a_fresh_process(model_dir, args, line):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(model_dir), "--prompt", "hi", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 2 and proc.stderr == line, proc.stderr


def test_long_prompt_is_cut_with_a_note(tmp_path, tokenizer, wired, load_script, capsys):
    # the wired model answers "!" right after the last prompt token, so the reply shows the cut prompt still ends
    # in <|assistant_start|>; sequence_len 64 with --max-new-tokens 8 leaves 56 prompt tokens
    model_dir = tmp_path / "m"
    wired(["<|assistant_start|>", "!", "<|assistant_end|>"]).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    chat = load_script("chat")  # in this process: test_one_shot_in_a_fresh_process is the fresh one
    prompt = "hello there " * 40
    code = chat.main(
        [
            "--model",
            str(model_dir),
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == "!\n"
    n = len(tokenizer.encode(prompt, add_special_tokens=False)) + 4  # bos, user_start, user_end, assistant_start
    assert [line for line in err.splitlines() if line.startswith("note")] == [
        f"note: the conversation is {n} tokens, more than the model's sequence_len 64 minus "
        "--max-new-tokens 8: the model sees <|bos|> and the last 55 tokens"
    ]
    # test_bad_arguments_in_a_fresh_process has a bad-input line in a fresh process
    code = chat.main(["--model", str(model_dir), "--prompt", "hi", "--max-new-tokens", "63", "--device", "cpu"])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "chat: error: --max-new-tokens 63 leaves no room for a prompt within the model's sequence_len 64"
    )


def test_a_conversation_over_2048_tokens_shows_the_model_its_latest_message(
    model_dir, tokenizer, monkeypatch, capsys, load_script
):
    import nanochat_hf.inference

    chat = load_script("chat")
    seen = []

    def capture(model, tok, prompts, *args, **kwargs):
        seen.extend(prompts)
        return [[tok.convert_tokens_to_ids("<|assistant_end|>")]]

    monkeypatch.setattr(nanochat_hf.inference, "generate_tokens", capture)
    lines = iter(["hello there " * 1200, "what about the zebra?", "quit"])  # the first one alone is over 2048
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert chat.main(["--model", str(model_dir), "--temperature", "0", "--device", "cpu"]) == 0
    latest = tokenizer.encode("what about the zebra?", add_special_tokens=False)
    end = [tokenizer.convert_tokens_to_ids(t) for t in ("<|user_end|>", "<|assistant_start|>")]
    assert seen[1][-len(latest) - 2 :] == latest + end  # the model sees the end of the conversation
    assert seen[1][0] == tokenizer.bos_token_id and "the model sees <|bos|> and the last" in capsys.readouterr().err
