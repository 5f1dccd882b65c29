"""Writes core_model/ and core_reference.json (this folder) from nanochat HEAD's own code; run by hand (README.md).

    mkdir -p /tmp/core-eval && cp -r <nanochat at 92d63d4> /tmp/core-eval/nc
    NANOCHAT_DTYPE=float32 python tests/evaluation/data/make_core_reference.py /tmp/core-eval/nc

1. nanochat's tokenizer: tests/tokenizer/data/nanochat_92d63d4 (HEAD's tok_train, vocab 400), loaded with HEAD's
   `RustBPETokenizer.from_directory`.
2. nanochat's GPT (HEAD, CPU float32) of the tiny config below, `init_weights()` after `torch.manual_seed(0)`, then
   trained for a few AdamW steps on the gold text of the bundle's even-numbered rows (so that some predictions are
   right, some wrong, and few options are near ties); saved as nanochat saves a base checkpoint and converted with
   this project's `scripts/convert.py from-nanochat` into core_model/ (our Hugging Face format; its remote-code
   .py files removed: the tests load the model through nanochat_hf's registration).
3. HEAD's `evaluate_core` (scripts/base_eval.py) on core_bundle/ (as $NANOCHAT_BASE_DIR/eval_bundle) with the GPT
   of step 2, all rows and max_per_task=11 (the 10-shot tasks need 11 rows). Its `evaluate_example`,
   `batch_sequences_*` and `forward_model` (nanochat/core_eval.py) are wrapped to record, per example, the
   sequences it built, the mean loss of each option (`losses[i, start-1:end-1].mean()`, as evaluate_example
   computes it) and its verdict.

    NANOCHAT_DTYPE=float32 python tests/evaluation/data/make_core_reference.py /tmp/core-eval/nc samples

then adds HEAD's base_eval samples of core_model/ (see `samples`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

assert os.environ.get("NANOCHAT_DTYPE") == "float32", "run with NANOCHAT_DTYPE=float32"
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BUNDLE = HERE / "core_bundle"
TOKENIZER = REPO / "tests" / "tokenizer" / "data" / "nanochat_92d63d4"
CONFIG = {"sequence_len": 1024, "n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "window_pattern": "SL"}
TRAIN_STEPS, LR = 800, 1e-2
SAMPLE_PROMPTS = [  # scripts/base_eval.py's
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
]
MAX_PER_TASK = 11  # 10-shot tasks need 11 rows (nanochat fails with fewer)


def tokens_sha(tokens, starts, ends) -> str:
    """A digest of an example's sequences and scored spans (the test recomputes it from ours)."""
    return hashlib.sha256(json.dumps([tokens, starts, ends]).encode()).hexdigest()[:16]


def gold_texts(even_only: bool) -> list[str]:
    """The gold rendering of each bundle row (context + delimiter + gold continuation)."""
    import yaml

    texts = []
    for task in yaml.safe_load((BUNDLE / "core.yaml").read_text())["icl_tasks"]:
        d = task.get("continuation_delimiter", " ")
        lines = (BUNDLE / "eval_data" / task["dataset_uri"]).read_text().splitlines()
        for n, line in enumerate(lines, start=1):
            if even_only and n % 2:
                continue
            row = json.loads(line)
            if "choices" in row:
                texts.append(row["query"] + d + row["choices"][row["gold"]])
            elif "context_options" in row:
                texts.append(row["context_options"][row["gold"]] + d + row["continuation"])
            else:
                texts.append(row["context"].strip() + d + row["continuation"])
    return texts


def build_model(gpt, tokenizer):
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=tokenizer.get_vocab_size(), **CONFIG))
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    data = [tokenizer(t, prepend=tokenizer.get_bos_token_id()) for t in gold_texts(even_only=True)]
    rng = random.Random(0)
    model.train()
    for step in range(TRAIN_STEPS):
        ids = torch.tensor([rng.choice(data)])
        loss = model(ids[:, :-1], targets=ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    return model.eval()


def main(nanochat: Path) -> None:
    sys.path.insert(0, str(nanochat))
    from nanochat import core_eval, gpt
    from nanochat.tokenizer import RustBPETokenizer

    from scripts import base_eval

    tokenizer = RustBPETokenizer.from_directory(str(TOKENIZER))
    model = build_model(gpt, tokenizer)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        # the checkpoint as nanochat's base_train saves it, converted by this project's command
        ckpt = base / "base_checkpoints" / "d2"
        ckpt.mkdir(parents=True)
        torch.save(model.state_dict(), ckpt / "model_000000.pt")
        meta = {"step": 0, "val_bpb": 0.0, "model_config": asdict(model.config), "user_config": {}}
        (ckpt / "meta_000000.json").write_text(json.dumps(meta, indent=2))
        shutil.copytree(TOKENIZER, base / "tokenizer")
        out = HERE / "core_model"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "convert.py"), "from-nanochat", "--checkpoint-dir", str(ckpt)]
            + ["--output", str(out), "--trust-pickle"],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        for remote_code in out.glob("*.py"):  # the model code the tests import from nanochat_hf, not a second copy
            remote_code.unlink()

        # HEAD's evaluate_core on the bundle, every example recorded
        shutil.copytree(BUNDLE, base / "eval_bundle")
        os.environ["NANOCHAT_BASE_DIR"] = str(base)
        examples, current = [], {}
        orig = {
            name: getattr(core_eval, name)
            for name in ("evaluate_example", "forward_model", "batch_sequences_mc", "batch_sequences_schema")
        }
        orig["batch_sequences_lm"] = core_eval.batch_sequences_lm

        def evaluate_example(idx, model, tokenizer, data, device, task_meta):
            current.clear()
            correct = orig["evaluate_example"](idx, model, tokenizer, data, device, task_meta)
            spans = list(zip(current["starts"], current["ends"]))
            losses = [current["losses"][i, s - 1 : e - 1].mean().item() for i, (s, e) in enumerate(spans)]
            if task_meta["task_type"] == "language_modeling":
                prediction = int(correct)
            else:
                prediction = losses.index(min(losses))
                assert (prediction == data[idx]["gold"]) == correct
            examples.append(
                {
                    "uri": task_meta["dataset_uri"],
                    "row": data[idx],
                    "prediction": prediction,
                    "correct": bool(correct),
                    "losses": losses,
                    "tokens_sha": tokens_sha(current["tokens"], current["starts"], current["ends"]),
                    "max_len": max(len(t) for t in current["tokens"]),
                }
            )
            return correct

        def batch_wrapper(name):
            def wrapped(tokenizer, prompts):
                tokens, starts, ends = orig[name](tokenizer, prompts)
                current.update(tokens=tokens, starts=starts, ends=ends)
                return tokens, starts, ends

            return wrapped

        def forward_model(model, input_ids):
            losses, predictions = orig["forward_model"](model, input_ids)
            current["losses"] = losses
            return losses, predictions

        core_eval.evaluate_example = evaluate_example
        core_eval.forward_model = forward_model
        for name in ("batch_sequences_mc", "batch_sequences_schema", "batch_sequences_lm"):
            setattr(core_eval, name, batch_wrapper(name))

        with torch.no_grad():
            full = base_eval.evaluate_core(model, tokenizer, "cpu")
            full_examples = list(examples)
            examples.clear()
            cut = base_eval.evaluate_core(model, tokenizer, "cpu", max_per_task=MAX_PER_TASK)

    longest = max(e["max_len"] for e in full_examples)
    assert longest <= CONFIG["sequence_len"] + 1, longest  # where nanochat's long layers and ours agree
    # each example's row, by its line in its file
    files = {}
    for e in full_examples:
        if e["uri"] not in files:
            files[e["uri"]] = [json.loads(x) for x in (BUNDLE / "eval_data" / e["uri"]).read_text().splitlines()]
        e["line"] = files[e["uri"]].index(e.pop("row")) + 1
        del e["max_len"]
    reference = {
        "made_by": "tests/evaluation/data/make_core_reference.py, nanochat 92d63d4 executing (README.md)",
        "model_config": CONFIG,
        "longest_sequence": longest,
        "full": {**full, "examples": full_examples},
        f"max_per_task_{MAX_PER_TASK}": cut,
    }
    (HERE / "core_reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(json.dumps(full["results"], indent=1), full["core_metric"], cut["core_metric"])


def samples(nanochat: Path) -> None:
    """HEAD's base_eval samples of core_model/ (taken back to nanochat with `convert.py to-nanochat`): each prompt
    after <|bos|>, `Engine.generate_batch(..., max_tokens=16, temperature=0)`, decoded; added to the reference."""
    sys.path.insert(0, str(nanochat))
    from nanochat import gpt
    from nanochat.engine import Engine
    from nanochat.tokenizer import RustBPETokenizer

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "base_checkpoints" / "d2"
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "convert.py"), "to-nanochat", "--model", str(HERE / "core_model")]
            + ["--output", str(ckpt), "--step", "0"],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        meta = json.loads((ckpt / "meta_000000.json").read_text())
        model = gpt.GPT(gpt.GPTConfig(**meta["model_config"]))
        model.init_weights()  # the rotary tables, as nanochat's checkpoint_manager.build_model does
        model.load_state_dict(torch.load(ckpt / "model_000000.pt", weights_only=True), strict=True, assign=True)
        tokenizer = RustBPETokenizer.from_directory(str(Path(tmp) / "tokenizer"))
    engine = Engine(model.eval(), tokenizer)
    texts = []
    for prompt in SAMPLE_PROMPTS:
        tokens = tokenizer(prompt, prepend="<|bos|>")
        sample, _ = engine.generate_batch(tokens, num_samples=1, max_tokens=16, temperature=0)
        texts.append(tokenizer.decode(sample[0]))
    reference = json.loads((HERE / "core_reference.json").read_text())
    reference["samples"] = texts
    (HERE / "core_reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print("\n".join(texts))


if __name__ == "__main__":
    if sys.argv[2:] == ["samples"]:
        samples(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]))
