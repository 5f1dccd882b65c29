"""Reference rows of nanochat HEAD's pretraining loader (nanochat/dataloader.py at 92d63d4), executed; see README.md.

Writes synthetic shards with `nanochat_hf.data.pretraining.write_synthetic_shards` into $NANOCHAT_BASE_DIR's
base_data_climbmix/, trains HEAD's tokenizer on them with HEAD's own scripts/tok_train.py (vocab 512), then runs
HEAD's `tokenizing_distributed_data_loader_with_state_bos_bestfit` (and the val loader) with `get_dist_info` stubbed
to emulate each rank, and stores per case and rank a sha256 of every micro-batch's rows and the state dict yielded
with it; resume cases start HEAD's loader from a saved rank-0 state on another number of ranks.
Usage: python make_pretrain_reference.py OUT_DIR   (OUT_DIR gets pretrain_reference.json and pretrain_tokenizer/)
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

NC = Path("/tmp/pretrain-data/nc")  # a copy of nanochat at 92d63d4
BASE = Path("/tmp/pretrain-data/base")  # its NANOCHAT_BASE_DIR
SHARDS = {"num_shards": 4, "docs_per_shard": 600, "seed": 48, "row_group_size": 64}
VOCAB = 512

# (name, split, W, B, T, buffer_size, tokenizer_batch_size, micro-batches per rank)
CASES = [
    ("w1_head_defaults", "train", 1, 2, 256, 1000, 128, 8),
    ("w2", "train", 2, 2, 128, 200, 32, 10),
    ("w3", "train", 3, 3, 64, 100, 16, 12),
    ("w2_val", "val", 2, 2, 128, 200, 32, 6),
    ("w3_epochs", "train", 3, 4, 256, 300, 64, 60),  # rank 2 reads a few row groups: wraps into epoch 2 and on
]
# (name, case it resumes, micro-batches drawn before the save, W of the resumed run, micro-batches after it)
RESUMES = [
    ("w2_to_w2", "w2", 4, 2, 6),
    ("w2_to_w3", "w2", 4, 3, 6),
    ("w3_to_w1", "w3", 7, 1, 6),
    ("w3_epochs_next_file", "w3_epochs", 12, 3, 10),  # rg_idx 9 of 10: the next round is past the shard's end
    ("w3_epochs_epoch2_to_w2", "w3_epochs", 40, 2, 12),  # a state of epoch 2
]


def rows_sha(x: torch.Tensor, y: torch.Tensor) -> str:
    """HEAD's row buffer (inputs, then the last target) as int64 bytes: what our stream's input_ids must equal."""
    rows = torch.cat([x, y[:, -1:]], dim=1).to(torch.int64).contiguous()
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]


def run_loader(dataloader, tokenizer, split, W, B, T, buffer_size, tok_batch, count, resume=None):
    ranks = []
    for r in range(W):
        dataloader.get_dist_info = lambda r=r: (W > 1, r, r, W)
        kw = dict(tokenizer_batch_size=tok_batch, device="cpu", resume_state_dict=resume, buffer_size=buffer_size)
        loader = dataloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(tokenizer, B, T, split, **kw)
        shas, states, first = [], [], None
        for _ in range(count):
            x, y, state = next(loader)
            shas.append(rows_sha(x, y))
            states.append(dict(state))
            first = first or torch.cat([x, y[:, -1:]], dim=1)[0, :24].tolist()
        ranks.append({"sha": shas, "state": states, "first_row_head": first})
    return ranks


def main(out_dir: Path) -> None:
    from nanochat_hf.data.pretraining import list_shards, write_synthetic_shards

    if BASE.exists():
        shutil.rmtree(BASE)
    write_synthetic_shards(BASE / "base_data_climbmix", **SHARDS)
    texts = hashlib.sha256()
    for path in list_shards(BASE / "base_data_climbmix"):
        for doc in pq.read_table(path)["text"].to_pylist():
            texts.update(doc.encode() + b"\0")
    env = {**os.environ, "NANOCHAT_BASE_DIR": str(BASE), "PYTHONPATH": str(NC)}
    subprocess.run(
        [sys.executable, "-m", "scripts.tok_train", "--vocab-size", str(VOCAB), "--max-chars", "3000000"],
        cwd=NC,
        env=env,
        check=True,
    )
    os.environ["NANOCHAT_BASE_DIR"] = str(BASE)
    sys.path.insert(0, str(NC))
    from nanochat import dataloader
    from nanochat.tokenizer import get_tokenizer

    tokenizer = get_tokenizer()
    cases = {}
    for name, split, W, B, T, buf, tb, count in CASES:
        cases[name] = {
            "split": split,
            "W": W,
            "B": B,
            "T": T,
            "buffer_size": buf,
            "tokenizer_batch_size": tb,
            "ranks": run_loader(dataloader, tokenizer, split, W, B, T, buf, tb, count),
        }
    resumes = {}
    for name, of, after, W2, count in RESUMES:
        c = cases[of]
        saved = c["ranks"][0]["state"][after]  # HEAD's base_train saves rank 0's state of the prefetched batch
        resumes[name] = {
            "of": of,
            "after": after,
            "saved_state": saved,
            "W": W2,
            "ranks": run_loader(
                dataloader,
                tokenizer,
                "train",
                W2,
                c["B"],
                c["T"],
                c["buffer_size"],
                c["tokenizer_batch_size"],
                count,
                resume=saved,
            ),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_out = out_dir / "pretrain_tokenizer"
    tok_out.mkdir(exist_ok=True)
    for f in ("tokenizer.pkl", "token_bytes.pt"):
        shutil.copy(BASE / "tokenizer" / f, tok_out / f)
    ref = {
        "nanochat": "92d63d4",
        "shards": {**SHARDS, "texts_sha256": texts.hexdigest()},
        "vocab_size": VOCAB,
        "cases": cases,
        "resumes": resumes,
    }
    (out_dir / "pretrain_reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
