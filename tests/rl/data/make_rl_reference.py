"""nanochat HEAD's (92d63d4) RL stage executing, on CPU in float32; writes tests/rl/data/ (run by hand):

    git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc
    pip install --target /tmp/ncdeps rustbpe            # imported by nanochat's tokenizer module (PyPI)
    python tests/rl/data/make_rl_reference.py /tmp/nc /tmp/ncdeps

1. The start model: the chain's base (tests/training/data/chain/nanochat: HEAD's tok_train + base_train, G5 depth 4)
   fine-tuned by HEAD's ``scripts.chat_sft`` with ``--gsm8k-epochs 8 --mmlu-epochs 0 --load-optimizer 0``, the
   val mixture edited to SmolTalk's test split as in make_chain_reference.py; GSM8K's train rows are 400 offline
   arithmetic word problems in openai/gsm8k's layout (nanochat_hf.tasks.demo.arithmetic_row, calculator annotations
   and ``#### N``), so the tiny model writes calculator calls and final numbers (rewards that differ within a
   prompt's samples, tool tokens forced in). Nothing is downloaded.
2. HEAD's ``scripts.chat_rl`` on that model, GSM8K train = 10 other arithmetic rows (``gsm8k_train.parquet``),
   test = 8 rows (``gsm8k_test.parquet``), with ``--examples-per-step 2 --num-samples 8 --device-batch-size 4
   --max-new-tokens 48 --eval-examples 8``: 10 // 2 = 5 steps (2 passes of 4 samples per prompt), pass@1..4 at
   step 0. Edited only to record what it
   computes (lines added, none changed): every example's sequences, targets (-1 where masked), rewards and
   advantages; every pass's loss; the gradients before each update whose advantages are not all 0 (the others'
   are 0); the evaluation's samples and pass@k; the weights after the 5 updates.
Written: ``nanochat/`` (the start model as HEAD's chatsft_checkpoints/d4 and the chain's tokenizer), the two
parquet files, ``rl_reference.json``, ``rl_grads_<step>.safetensors``,
``rl_final.safetensors`` (nanochat's parameter names, float32).
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

from nanochat_hf.tasks.demo import arithmetic_row

OUT = Path(__file__).parent
CHAIN = Path(__file__).parents[2] / "training" / "data" / "chain"
SFT_ROWS = [arithmetic_row(i, "train") for i in range(400)]
RL_TRAIN = [arithmetic_row(i, "train") for i in range(1000, 1010)]
RL_TEST = [arithmetic_row(i, "test") for i in range(8)]
CHAT_SFT = "--mmlu-epochs 0 --gsm8k-epochs 8 --load-optimizer 0 --eval-tokens 2048 --chatcore-every -1".split()
CHAT_RL = (
    "--examples-per-step 2 --num-samples 8 --device-batch-size 4 --max-new-tokens 48 --eval-examples 8 "
    "--device-type cpu"
).split()
RECORD = [  # (line of chat_rl.py, lines added after it)
    (
        "from tasks.gsm8k import GSM8K\n",
        "import json as _json\nfrom safetensors.torch import save_file as _save\n"
        '_REC = {"examples": [], "losses": [], "eval": [], "rewards": []}\n',
    ),
    (
        "        sequences_all, inputs_all, targets_all, rewards_all, advantages_all = next(batch_iterator)\n",
        '        _REC["examples"].append({"step": step, "sequences": sequences_all, "targets": targets_all.tolist(), '
        '"rewards": rewards_all.tolist(), "advantages": advantages_all.tolist()})\n',
    ),
    ("            loss.backward()\n", '            _REC["losses"].append(loss.item())\n'),
    (
        '            "outcomes": outcomes,\n',
        '            "samples": [s[prefix_length:] for s in generated_token_sequences],\n',
    ),
    (
        "        print0(f\"Step {step} | {', '.join(print_passk)}\")\n",
        '        _REC["eval"].append({"step": step, "passk": passk.tolist(), "records": records})\n',
    ),
    (
        "    mean_sequence_length = sum(sequence_lengths) / len(sequence_lengths)\n",
        '    _REC["rewards"].append(mean_reward)\n'
        '    if any(a != 0 for e in _REC["examples"] if e["step"] == step for a in e["advantages"]):\n'
        "        _save({n: p.grad.float().contiguous() for n, p in model.named_parameters() if p.grad is not None}, "
        'os.environ["RL_OUT"] + f"/rl_grads_{step}.safetensors")\n',
    ),
    (
        "wandb_run.finish() # wandb run finish\n",
        '_save({n: p.detach().float().contiguous() for n, p in model.state_dict().items()}, os.environ["RL_OUT"] + '
        '"/rl_final.safetensors")\n'
        '_REC["num_steps"] = num_steps\n'
        'open(os.environ["RL_OUT"] + "/rl_reference.json", "w").write(_json.dumps(_REC))\n',
    ),
]


def put_rows(base: Path, split: str, rows: list[dict]) -> None:
    """Rows where HEAD's load_hub_dataset finds a finished download of openai/gsm8k (main)."""
    where = base / "task_data" / "openai--gsm8k" / "main" / split
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), where / "00000.parquet")
    (where / "manifest.json").write_text(json.dumps(["00000.parquet"]))


def main(tree: Path, deps: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="nanochat-rl-")) / "nanochat"
    stubs = base.parent / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "wandb.py").write_text('"""stub: the runs use DummyWandb (--run dummy)."""\n')
    env = {
        **os.environ,
        "NANOCHAT_BASE_DIR": str(base),
        "NANOCHAT_DTYPE": "float32",
        "TORCHDYNAMO_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "RL_OUT": str(OUT),
        "PYTHONPATH": os.pathsep.join([str(tree), str(deps), str(stubs)]),
    }
    shutil.copytree(CHAIN / "nanochat", base)
    sft = base / "task_data" / "HuggingFaceTB--smol-smoltalk" / "default"
    for split in ("train", "test"):
        (sft / split).mkdir(parents=True)
        shutil.copy(CHAIN / f"sft_{split}.parquet", sft / split / "00000.parquet")
        (sft / split / "manifest.json").write_text(json.dumps(["00000.parquet"]))
    put_rows(base, "train", SFT_ROWS)

    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc.stdout

    text = (tree / "scripts" / "chat_sft.py").read_text()
    val = re.search(r"val_dataset = TaskMixture\(\[\n.*?\]\)", text, re.S).group(0)
    (tree / "scripts" / "chat_sft_rl.py").write_text(
        text.replace(val, 'val_dataset = TaskMixture([SmolTalk(split="test")])')
    )
    print(run("-m", "scripts.chat_sft_rl", *CHAT_SFT, "--device-type", "cpu")[-1500:])
    put_rows(base, "train", RL_TRAIN)
    put_rows(base, "test", RL_TEST)
    text = (tree / "scripts" / "chat_rl.py").read_text()
    for line, added in RECORD:
        assert text.count(line) == 1, line
        text = text.replace(line, line + added)
    (tree / "scripts" / "chat_rl_record.py").write_text(text)
    print(run("-m", "scripts.chat_rl_record", *CHAT_RL)[-3000:])
    shutil.rmtree(OUT / "nanochat", ignore_errors=True)
    (OUT / "nanochat").mkdir()
    shutil.copytree(
        base / "chatsft_checkpoints", OUT / "nanochat" / "chatsft_checkpoints", ignore=shutil.ignore_patterns("optim_*")
    )
    shutil.copytree(base / "tokenizer", OUT / "nanochat" / "tokenizer")
    pq.write_table(pa.Table.from_pylist(RL_TRAIN), OUT / "gsm8k_train.parquet")
    pq.write_table(pa.Table.from_pylist(RL_TEST), OUT / "gsm8k_test.parquet")
    reference = json.loads((OUT / "rl_reference.json").read_text())
    reference.update(nanochat_commit="92d63d4", chat_rl_flags=CHAT_RL)
    (OUT / "rl_reference.json").write_text(json.dumps(reference) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
