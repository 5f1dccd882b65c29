"""The whole chain with nanochat HEAD (92d63d4) executing, on CPU in float32; writes data/chain/ (run by hand):

    git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc
    pip install --target /tmp/ncdeps rustbpe            # nanochat's tokenizer trainer (PyPI)
    python tests/training/data/make_chain_reference.py /tmp/nc /tmp/ncdeps

1. Local data (nothing is downloaded): pretraining text = the offline demo mixture's texts as parquet shards in
   ``$NANOCHAT_BASE_DIR/base_data_climbmix`` (last shard = val); SFT rows = the demo mixture's plain-text
   conversations in smol-smoltalk's layout (``messages``), placed where HEAD's ``load_hub_dataset`` finds a
   finished download (``task_data/HuggingFaceTB--smol-smoltalk/default/<split>/``) and kept as ``sft_<split>.parquet``.
2. nanochat's ``scripts.tok_train`` (vocab 512) and ``scripts.base_train`` (G5 at depth 4, n_embd 32, 2 heads,
   sequence 256 so the short window slides, 20 steps; it writes model, meta and optimizer files).
3. nanochat's ``scripts.chat_sft`` on that base with its defaults (warm-started optimizer, inherited batch and LRs)
   but ``--mmlu-epochs 0 --gsm8k-epochs 0 --eval-tokens 2048 --chatcore-every -1``, and three edits of its text:
   the val mixture is SmolTalk's test split only (MMLU/GSM8K would need downloads), and the loss and val bpb are
   printed with every digit (``!r`` instead of ``:.6f`` / ``:.4f``).
4. nanochat's ``load_model("sft")`` and ``Engine.generate`` (greedy, 16 tokens) on three prompts, and its
   ``scripts.chat_eval -i sft -a "MMLU|GSM8K" -x 20 -m 32`` on 20 local rows of each (synthetic sums in cais/mmlu's
   and openai/gsm8k's layouts, in the task cache as above).
5. The check the suite cannot make without nanochat: our SFT with its defaults (``configs/sft_nanochat.yaml`` on the
   base folder, the local mixture ``chain/mixture.yaml``, ``--eval_tokens 2048 --chatcore_every -1``), exported with
   ``convert.py to-nanochat`` into another copy's ``chatsft_checkpoints/d4``, loaded there by nanochat's
   ``load_model("sft")``, ``Engine`` and ``chat_eval``: recorded as ``engine_on_our_export`` and ``chat_eval``.
Written: the base folder as nanochat left it (``nanochat/base_checkpoints/d4/*_000020*``, ``nanochat/tokenizer``),
the SFT rows, ``nanochat_sft.safetensors`` (chat_sft's final weights, nanochat's names, float32) and
``reference.json`` (every step's logged loss, the val bpb at the first and last step, the prompts and tokens).
``NANOCHAT_DTYPE=float32`` and ``TORCHDYNAMO_DISABLE=1`` (nanochat's torch.compile runs eagerly); wandb is a stub.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from nanochat_hf.data import load_mixture
from nanochat_hf.data.demo import demo_texts

OUT = Path(__file__).parent / "chain"
PROMPTS = ["Spell the word: apple", "What is nanochat-hf?", "Count the letter 'a' in the word 'banana'."]
BASE_TRAIN = (
    "--depth 4 --aspect-ratio 8 --head-dim 16 --max-seq-len 256 --device-batch-size 2 --total-batch-size 1024 "
    "--num-iterations 20 --eval-every 10 --eval-tokens 2048 --core-metric-every -1 --sample-every -1 "
    "--warmup-steps 2 --device-type cpu"
).split()
MMLU = [  # cais/mmlu's columns; the answer is choice (a + b) % 4
    {
        "question": f"What is {a} plus {b}?",
        "subject": "elementary_mathematics",
        "choices": [str(a + b + (i - (a + b) % 4)) for i in range(4)],
        "answer": (a + b) % 4,
    }
    for a, b in ((3 * i + 1, 7 * i % 11) for i in range(20))
]
GSM8K = [  # openai/gsm8k's columns, with nanochat's calculator markup
    {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
    }
    for a, b in ((2 * i + 3, 5 * i % 9 + 1) for i in range(20))
]
CHAT_SFT = "--mmlu-epochs 0 --gsm8k-epochs 0 --eval-tokens 2048 --chatcore-every -1 --device-type cpu".split()
ENGINE = """
import json, sys, torch
from nanochat.checkpoint_manager import load_model
from nanochat.engine import Engine
model, tokenizer, meta = load_model("sft", torch.device("cpu"), phase="eval")
engine = Engine(model, tokenizer)
out = []
for prompt in json.loads(sys.argv[1]):
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]
    tokens = tokenizer.render_for_completion({"messages": messages})
    generated = []
    for token_column, _ in engine.generate(tokens, num_samples=1, max_tokens=16, temperature=0.0):
        generated.append(token_column[0])
    out.append(generated)
print("TOKENS " + json.dumps(out))
"""


def sft_rows(split: str, n: int) -> list[dict]:
    """The demo mixture's conversations whose turns are plain text, in smol-smoltalk's layout."""
    rows = []
    for conversation in load_mixture(None, split=split)["conversation"]:
        messages = json.loads(conversation)["messages"]
        if all(isinstance(m["content"], str) for m in messages) and messages[0]["role"] == "user":
            rows.append({"messages": [{"role": m["role"], "content": m["content"]} for m in messages]})
    return rows[:: max(1, len(rows) // n)][:n]


def main(tree: Path, deps: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="nanochat-chain-")) / "nanochat"
    stubs = base.parent / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "wandb.py").write_text('"""stub: the runs use DummyWandb (--run dummy)."""\n')
    env = {
        **os.environ,
        "NANOCHAT_BASE_DIR": str(base),
        "NANOCHAT_DTYPE": "float32",
        "TORCHDYNAMO_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(tree), str(deps), str(stubs)]),
    }
    # 1. data
    texts, docs, current = demo_texts(), [], ""
    for text in texts:
        current += text + "\n"
        if len(current) > 1000:
            docs.append(current)
            current = ""
    shards = base / "base_data_climbmix"
    shards.mkdir(parents=True)
    cut = len(docs) * 9 // 10
    pq.write_table(pa.table({"text": docs[:cut]}), shards / "shard_00000.parquet", row_group_size=256)
    pq.write_table(pa.table({"text": docs[cut:]}), shards / "shard_00001.parquet", row_group_size=256)
    OUT.mkdir(exist_ok=True)
    for split, hub_split, n in (("train", "train", 480), ("val", "test", 60)):
        table = pa.Table.from_pylist(sft_rows(split, n))
        pq.write_table(table, OUT / f"sft_{hub_split}.parquet")
        where = base / "task_data" / "HuggingFaceTB--smol-smoltalk" / "default" / hub_split
        where.mkdir(parents=True)
        pq.write_table(table, where / "00000.parquet")
        (where / "manifest.json").write_text(json.dumps(["00000.parquet"]))

    for repo_id, subset, rows in (("cais/mmlu", "all", MMLU), ("openai/gsm8k", "main", GSM8K)):
        where = base / "task_data" / repo_id.replace("/", "--") / subset / "test"
        where.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), where / "00000.parquet")
        (where / "manifest.json").write_text(json.dumps(["00000.parquet"]))

    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc.stdout

    # 2. tokenizer and base model
    run("-m", "scripts.tok_train", "--max-chars", "2000000", "--vocab-size", "512")
    run("-m", "scripts.base_train", *BASE_TRAIN)
    # 3. chat_sft, with the edits the docstring lists
    text = (tree / "scripts" / "chat_sft.py").read_text()
    val = re.search(r"val_dataset = TaskMixture\(\[\n.*?\]\)", text, re.S).group(0)
    edits = [
        (val, 'val_dataset = TaskMixture([SmolTalk(split="test")])'),
        ("loss: {debiased_smooth_loss:.6f}", "loss: {debiased_smooth_loss!r}"),
        ("Validation bpb: {val_bpb:.4f}", "Validation bpb: {val_bpb!r}"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (tree / "scripts" / "chat_sft_chain.py").write_text(text)
    out = run("-m", "scripts.chat_sft_chain", *CHAT_SFT)
    losses = [float(m) for m in re.findall(r"^step \d+ \([\d.]+%\) \| loss: ([\d.e-]+)", out, re.M)]
    bpb = [float(m) for m in re.findall(r"^Step \d+ \| Validation bpb: ([\d.e-]+)", out, re.M)]
    # 4. nanochat's own loader and Engine on its SFT result
    tokens = json.loads(run("-c", ENGINE, json.dumps(PROMPTS)).split("TOKENS ", 1)[1])
    chat_eval = ["-m", "scripts.chat_eval", "-i", "sft", "-a", "MMLU|GSM8K", "-x", "20", "-m", "32"]
    evals = {"nanochat": re.findall(r"^\w+ accuracy: .*$", run(*chat_eval, "--device-type", "cpu"), re.M)}
    sft_dir = base / "chatsft_checkpoints" / "d4"
    [model_file] = sft_dir.glob("model_*.pt")
    state = torch.load(model_file, map_location="cpu", weights_only=True)
    save_file({k: v.float().contiguous() for k, v in state.items()}, OUT / "nanochat_sft.safetensors")
    meta = json.loads(next(sft_dir.glob("meta_*.json")).read_text())
    shutil.rmtree(OUT / "nanochat", ignore_errors=True)
    shutil.copytree(base / "base_checkpoints", OUT / "nanochat" / "base_checkpoints")
    shutil.copytree(base / "tokenizer", OUT / "nanochat" / "tokenizer")
    # 5. ours, with its defaults, exported and read back by nanochat's loader and Engine
    ours = base.parent / "ours"
    repo = Path(__file__).resolve().parents[3]
    mixture = str(OUT / "mixture.yaml")
    sft = [sys.executable, str(repo / "scripts" / "mid_train.py"), str(repo / "configs" / "sft_nanochat.yaml")]
    flags = ["--model_source", str(OUT / "nanochat"), "--train_mixture", mixture, "--val_mixture", mixture]
    flags += ["--eval_tokens", "2048", "--chatcore_every", "-1", "--torch_compile", "false", "--output_dir", str(ours)]
    subprocess.run([*sft, *flags, "--spelling_eval_rows", "0"], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    shutil.rmtree(base / "chatsft_checkpoints")
    convert = [sys.executable, str(repo / "scripts" / "convert.py"), "to-nanochat", "--model", str(ours)]
    subprocess.run([*convert, "--output", str(sft_dir), "--overwrite"], check=True)
    ours_tokens = json.loads(run("-c", ENGINE, json.dumps(PROMPTS)).split("TOKENS ", 1)[1])
    evals["our_export"] = re.findall(r"^\w+ accuracy: .*$", run(*chat_eval, "--device-type", "cpu"), re.M)
    reference = {
        "nanochat_commit": "92d63d4",
        "losses": losses,
        "val_bpb": bpb,
        "sft_step": meta["step"],
        "prompts": PROMPTS,
        "tokens": tokens,
        "engine_on_our_export": ours_tokens,
        "chat_eval": evals,
        "chat_sft_output": [line for line in out.splitlines() if line.startswith(("Inherited", "Loaded", "Using"))],
    }
    (OUT / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(json.dumps(reference, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
