"""DCLM CORE (`nanochat_hf.evaluation.core`, `scripts/base_eval.py`) against nanochat HEAD's core_eval.py executing
on the same bundle rows and the same weights (data/core_reference.json, data/make_core_reference.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanochat_hf.errors import UserError
from nanochat_hf.evaluation import core
from nanochat_hf.evaluation.base_eval import base_bpb, base_samples

DATA = Path(__file__).parent / "data"
BUNDLE = DATA / "core_bundle"
REFERENCE = json.loads((DATA / "core_reference.json").read_text())
REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only waits for its share (3x slower on a busy machine)
    model = AutoModelForCausalLM.from_pretrained(DATA / "core_model", dtype=torch.float32)
    yield model.eval(), AutoTokenizer.from_pretrained(DATA / "core_model")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def full_run(model_and_tokenizer):
    """evaluate_core on the whole bundle (32 sequences per forward: several examples share one), and every
    example's score as it computed it."""
    model, tokenizer = model_and_tokenizer
    seen = {}
    score_examples = core.score_examples

    def spy(model, tokenizer, task, indices, *args, **kwargs):
        scores = score_examples(model, tokenizer, task, indices, *args, **kwargs)
        uri = task.path.relative_to(BUNDLE / "eval_data").as_posix()
        seen.update({(uri, task.lines[i]): (task, i, s) for i, s in zip(indices, scores)})
        return scores

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "score_examples", spy)
        result = core.evaluate_core(model, tokenizer, BUNDLE, verbose=False)
    return result, seen


def test_core_equals_nanochat(full_run):
    """Each task's accuracy, its centered score and CORE are nanochat's, exactly."""
    result, _ = full_run
    ref = REFERENCE["full"]
    assert result == {k: ref[k] for k in ("results", "centered_results", "core_metric")}
    # the reference exercises both outcomes of every kind of task
    assert 0 < ref["results"]["winogrande"] < 1 and 0 < ref["results"]["lambada_openai"] < 1


def test_every_example_as_nanochat(full_run, model_and_tokenizer):
    """Every example: the same sequences and scored spans, the same prediction and verdict, the same mean losses."""
    _, seen = full_run
    _, tokenizer = model_and_tokenizer
    bos = core.bos_id(tokenizer)
    assert len(seen) == len(REFERENCE["full"]["examples"]) == 58
    for ref in REFERENCE["full"]["examples"]:
        task, i, score = seen[(ref["uri"], ref["line"])]
        tokens, starts, ends = core.example_tokens(task, i, tokenizer, bos)
        where = f"{task.label} line {ref['line']}"
        sha = hashlib.sha256(json.dumps([tokens, starts, ends]).encode()).hexdigest()[:16]
        assert sha == ref["tokens_sha"], where
        assert (score.prediction, score.correct) == (ref["prediction"], ref["correct"]), where
        assert score.losses == pytest.approx(ref["losses"], rel=1e-5, abs=1e-6), where


def test_max_per_task(model_and_tokenizer):
    """--max_per_task 11: nanochat's first 11 rows after its shuffle, the few-shot examples drawn among them."""
    model, tokenizer = model_and_tokenizer
    result = core.evaluate_core(model, tokenizer, BUNDLE, max_per_task=11, batch_size=8, verbose=False)
    assert result == REFERENCE["max_per_task_11"]


def test_one_example_per_forward(model_and_tokenizer):
    """batch_size 1 (one example per forward, as nanochat runs them): the same predictions and losses."""
    model, tokenizer = model_and_tokenizer
    ref = {(e["uri"], e["line"]): e for e in REFERENCE["full"]["examples"]}
    for task in core.load_bundle(BUNDLE)[2:5]:  # winograd, winogrande, lambada_openai: the short ones
        uri = task.path.relative_to(BUNDLE / "eval_data").as_posix()
        scores = core.score_examples(model, tokenizer, task, list(range(len(task.rows))), batch_size=1)
        for line, score in zip(task.lines, scores):
            assert score.prediction == ref[(uri, line)]["prediction"], (task.label, line)
            assert score.losses == pytest.approx(ref[(uri, line)]["losses"], rel=1e-5, abs=1e-6)


def test_any_causal_lm_cropped_to_its_positions(model_and_tokenizer):
    """A transformers GPT-2 (absolute positions, n_positions 128) with the same tokenizer: sequences longer than
    128 tokens keep their last 128 (the scored spans shifted, as nanochat crops for a model's max_seq_len), and
    batching changes no prediction."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=1, n_head=2)
    gpt2 = GPT2LMHeadModel(config).eval()
    assert core.default_max_seq_len(gpt2) == 128
    task = core.load_bundle(BUNDLE)[1]  # arc_easy, 10-shot: about 800 tokens
    bos = core.bos_id(tokenizer)
    (full, *_), starts, ends = core.example_tokens(task, 0, tokenizer, bos)
    (cropped, *_), cstarts, cends = core.example_tokens(task, 0, tokenizer, bos, max_seq_len=128)
    assert len(full) > 128 and cropped == full[-128:]
    assert (cstarts[0], cends[0]) == (starts[0] - (len(full) - 128), ends[0] - (len(full) - 128))
    one = core.score_examples(gpt2, tokenizer, task, list(range(6)), batch_size=1, max_seq_len=128)
    batched = core.score_examples(gpt2, tokenizer, task, list(range(6)), batch_size=32, max_seq_len=128)
    assert [s.prediction for s in one] == [s.prediction for s in batched]
    for a, b in zip(one, batched):
        assert a.losses == pytest.approx(b.losses, rel=1e-5)


def _task(kind: str, shots: int, delimiter: str, *rows: dict) -> core.CoreTask:
    return core.CoreTask(kind, kind, shots, delimiter, 0.0, list(rows), list(range(1, len(rows) + 1)), Path(kind))


def test_prompts_render_as_nanochat():
    """The three templates of core_eval.py (fixed strings: few-shot blocks, delimiter, LM trim and strip)."""
    assert core.fewshot_indices(2, 0, 1) == [1]
    mc = _task(
        "multiple_choice",
        1,
        "\nAnswer: ",
        {"query": "Q0", "choices": ["a", "b"], "gold": 1},
        {"query": "Q1", "choices": ["c", "d"], "gold": 0},
    )
    assert core.render_prompts(mc, 0) == ["Q1\nAnswer: c\n\nQ0\nAnswer: a", "Q1\nAnswer: c\n\nQ0\nAnswer: b"]
    schema = _task(
        "schema",
        1,
        " ",
        {"context_options": ["A x", "A y"], "continuation": "ok.", "gold": 1},
        {"context_options": ["B x", "B y"], "continuation": "no.", "gold": 0},
    )
    assert core.render_prompts(schema, 0) == ["B x no.\n\nA x ok.", "B x no.\n\nA y ok."]
    lm = _task(
        "language_modeling",
        1,
        " ",
        {"context": " ctx0  ", "continuation": "w0"},
        {"context": "ctx1\n", "continuation": "w1"},
    )
    assert core.render_prompts(lm, 0) == ["ctx1 w1\n\nctx0", "ctx1 w1\n\nctx0 w0"]


def test_shards_across_processes(model_and_tokenizer):
    """Under torch.distributed each rank scores its stride of the examples and the verdicts are all-reduced: a
    world of two where this rank is rank 1 of 2 (gloo, one process) scores rows 1, 3, 5, ...; the sum with
    rank 0's share gives nanochat's accuracy."""
    model, tokenizer = model_and_tokenizer
    task = core.load_bundle(BUNDLE)[3]  # winogrande: 3-shot schema
    ref = {e["line"]: e["correct"] for e in REFERENCE["full"]["examples"] if e["uri"].endswith("winogrande.jsonl")}
    calls = []

    def fake_all_reduce(tensor, op=None):
        calls.append(tensor.clone())
        for i in range(0, len(task.rows), 2):  # rank 0's share, as it would arrive
            tensor[i] += float(ref[task.lines[i]])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core.dist, "is_initialized", lambda: True)
        mp.setattr(core.dist, "get_rank", lambda: 1)
        mp.setattr(core.dist, "get_world_size", lambda: 2)
        mp.setattr(core.dist, "all_reduce", fake_all_reduce)
        accuracy = core.evaluate_task(model, tokenizer, task, show_progress=False)
    (mine,) = calls
    assert mine[0::2].tolist() == [0.0] * 4  # rank 1 left rank 0's rows alone
    assert mine[1::2].tolist() == [float(ref[task.lines[i]]) for i in range(1, 8, 2)]
    assert accuracy == REFERENCE["full"]["results"]["winogrande"]


# ---------------------------------------------------------------- bad input: one line each


def _bundle_copy(tmp_path) -> Path:
    folder = tmp_path / "eval_bundle"
    shutil.copytree(BUNDLE, folder)
    return folder


def test_missing_task_file(tmp_path):
    folder = _bundle_copy(tmp_path)
    (folder / "eval_data" / "language_understanding" / "winograd_wsc.jsonl").unlink()
    with pytest.raises(UserError) as e:
        core.load_bundle(folder)
    assert str(e.value) == (
        f"task winograd: no task file {folder}/eval_data/language_understanding/winograd_wsc.jsonl "
        "(core.yaml's dataset_uri 'language_understanding/winograd_wsc.jsonl')"
    )


@pytest.mark.parametrize(
    "line, message",
    [
        (
            '{"query": "Q", "choices": ["a"], "gold": 0',
            "not JSON (Expecting ',' delimiter: line 1 column 43 (char 42))",
        ),
        ('{"query": "Q", "gold": 0}', "no field 'choices' (multiple_choice rows have query, choices, gold)"),
        (
            '{"query": "Q", "choices": ["a", 2], "gold": 0}',
            "field 'choices' is [\"a\", 2], expected a non-empty list of strings",
        ),  # fmt: skip
        ('{"query": "Q", "choices": ["a", "b"], "gold": 2}', "field 'gold' is 2, expected an index of its 2 options"),
        ('["Q"]', "expected a JSON object"),
    ],
)
def test_malformed_row(tmp_path, line, message):
    folder = _bundle_copy(tmp_path)
    path = folder / "eval_data" / "world_knowledge" / "arc_easy.jsonl"
    lines = path.read_text().splitlines()
    lines[6] = line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        core.load_bundle(folder)
    assert str(e.value) == f"{path} line 7: {message}"


def test_missing_core_yaml(tmp_path):
    folder = _bundle_copy(tmp_path)
    (folder / "core.yaml").unlink()
    with pytest.raises(UserError) as e:
        core.load_bundle(folder)
    assert str(e.value) == (
        f"no core.yaml in {folder} (an eval bundle holds core.yaml, eval_meta_data.csv and eval_data/)"
    )


def test_too_few_rows_for_the_shots(tmp_path):
    with pytest.raises(UserError, match=r"^task arc_easy: 10-shot needs at least 11 rows, .*arc_easy.jsonl gives 5$"):
        core.load_bundle(BUNDLE, max_per_task=5)


def test_no_bundle_and_no_download(tmp_path, monkeypatch):
    """Neither a folder nor the network: one line naming both; nothing is left behind."""

    def offline(target, url=core.EVAL_BUNDLE_URL):
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(core, "download_bundle", offline)
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "base"))
    with pytest.raises(UserError) as e:
        core.ensure_bundle()
    assert str(e.value) == (
        f"no eval bundle at {tmp_path}/base/eval_bundle and it could not be downloaded from {core.EVAL_BUNDLE_URL} "
        "(<urlopen error [Errno -3] Temporary failure in name resolution>); unzip it there or pass --bundle_dir"
    )
    assert not (tmp_path / "base" / "eval_bundle").exists()


def test_download_places_the_bundle(tmp_path):
    """The zip as nanochat serves it (a top-level eval_bundle/ folder) is unpacked to the bundle folder."""
    served = tmp_path / "eval_bundle.zip"
    with zipfile.ZipFile(served, "w") as z:
        for f in sorted(BUNDLE.rglob("*")):
            z.write(f, "eval_bundle/" + f.relative_to(BUNDLE).as_posix())
    target = tmp_path / "base" / "eval_bundle"
    core.download_bundle(target, url=served.as_uri())
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == sorted(
        p.relative_to(BUNDLE) for p in BUNDLE.rglob("*")
    )
    assert sorted(p.name for p in target.parent.iterdir()) == ["eval_bundle"]  # no temporary left


# ---------------------------------------------------------------- the script


def _script():
    spec = importlib.util.spec_from_file_location("base_eval_script", REPO / "scripts" / "base_eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_script_core(tmp_path, monkeypatch, capsys):
    """`base_eval.py --model DIR --eval core`: nanochat's lines, its CSV in $NANOCHAT_BASE_DIR/base_eval/, JSON."""
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    out = tmp_path / "core.json"
    argv = ["--model", str(DATA / "core_model"), "--eval", "core", "--bundle_dir", str(BUNDLE)]
    assert _script().main([*argv, "--max_per_task", "11", "--json", str(out), "--num_threads", "1"]) == 0
    stdout = capsys.readouterr().out
    ref = REFERENCE["max_per_task_11"]
    assert f"CORE metric: {ref['core_metric']:.4f}" in stdout
    assert "Evaluating: winogrande (3-shot, type: schema)... accuracy: 0.8750 | centered: 0.7500" in stdout
    assert json.loads(out.read_text()) == ref
    csv = (tmp_path / "base_eval" / "core_model.csv").read_text().splitlines()
    assert csv[0].split(",")[0].strip() == "Task" and csv[-1].split(",")[0].strip() == "CORE"
    assert float(csv[-1].split(",")[2]) == pytest.approx(ref["core_metric"], abs=1e-6)


def test_script_bad_bundle_is_one_line(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    (folder / "core.yaml").unlink()
    argv = ["--model", str(DATA / "core_model"), "--eval", "core", "--bundle_dir", str(folder)]
    assert _script().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = "an eval bundle holds core.yaml, eval_meta_data.csv and eval_data/"
    assert err == [f"base_eval: error: no core.yaml in {folder} ({expected})"]


def test_script_bad_eval_mode(capsys):
    assert _script().main(["--model", "x", "--eval", "core,bpbx"]) == 2
    assert capsys.readouterr().err.strip() == (
        "base_eval: error: --eval 'core,bpbx': expected a comma-separated list of core, bpb, sample"
    )


def test_samples(model_and_tokenizer):
    """nanochat's sample prompts, each after BOS, continued greedily for 16 tokens: the texts HEAD's base_eval
    prints for the same weights (its Engine, kv cache and all); unconditioned samples start at BOS."""
    model, tokenizer = model_and_tokenizer
    conditioned, unconditioned = base_samples(model, tokenizer, unconditioned=2, unconditioned_tokens=8, seed=0)
    assert conditioned == REFERENCE["samples"]
    assert len(unconditioned) == 2 and all(s.startswith("<|bos|>") for s in unconditioned)


def test_bpb(model_and_tokenizer, tmp_path, capsys):
    """Bits per byte as nanochat's base_eval: split_tokens rounded down to whole steps (5000 -> 2 rows of 1024 + 1
    tokens, said as nanochat says it), the first rows of each split's pretraining stream, nats of the targets that
    have bytes over ln 2 times their bytes."""
    from nanochat_hf.data.pretraining import PretrainStream, write_synthetic_shards
    from nanochat_hf.tokenizer import token_bytes

    model, tokenizer = model_and_tokenizer
    write_synthetic_shards(tmp_path, 3, 200)
    result = base_bpb(model, tokenizer, device_batch_size=1, split_tokens=2500, data_dir=tmp_path)
    assert capsys.readouterr().out == "Adjusted split_tokens to 2048 (must be divisible by 1024)\n"
    sizes = token_bytes(tokenizer)
    for split in ("train", "val"):
        rows = torch.cat([b["input_ids"] for b in PretrainStream(tokenizer, 1, 1024, split, data_dir=tmp_path).read(2)])
        with torch.no_grad():
            logits = model(input_ids=rows).logits[:, :-1].double()
        nats = torch.nn.functional.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")
        nbytes = sizes[rows[:, 1:]]
        expected = (nats * (nbytes > 0)).sum().item() / (math.log(2) * nbytes.sum().item())
        assert result[split] == pytest.approx(expected, rel=1e-5)


def test_bpb_refusals(tmp_path):
    """No shards, or a model whose per-token losses are not nanochat's: one line each."""
    from nanochat_hf.data.pretraining import write_synthetic_shards
    from nanochat_hf.evaluation.base_eval import check_bpb

    with pytest.raises(UserError, match=rf"^{tmp_path}: no \*\.parquet shards in the folder \(download shards with"):
        check_bpb(tmp_path)

    write_synthetic_shards(tmp_path, 2, 10)
    gpt2 = type("M", (), {"config": type("C", (), {"model_type": "gpt2"})()})()
    with pytest.raises(UserError) as e:
        check_bpb(tmp_path, gpt2)
    assert str(e.value) == "--eval bpb needs a nanochat_gpt model (per-token losses); this one is gpt2"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_script_under_accelerate_launch(tmp_path):
    """Two processes (gloo on CPU), each its stride of every task, the verdicts all-reduced: nanochat's numbers."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(29700 + os.getpid() % 1000)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["NANOCHAT_BASE_DIR"] = str(tmp_path)
    out = tmp_path / "core.json"
    argv = ["--model", str(DATA / "core_model"), "--eval", "core", "--bundle_dir", str(BUNDLE), "--json", str(out)]
    proc = subprocess.run(
        [*launcher, str(REPO / "scripts" / "base_eval.py"), *argv, "--num_threads", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text()) == {
        k: REFERENCE["full"][k] for k in ("results", "centered_results", "core_metric")
    }
    assert proc.stdout.count("CORE metric:") == 1  # said once, by the main process
