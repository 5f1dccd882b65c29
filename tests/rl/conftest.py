"""The tiny G5 model HEAD's base_train + chat_sft made and its offline GSM8K-layout rows (data/, see
data/make_rl_reference.py), and the flags that run chat_rl.py's reference settings on them."""

from pathlib import Path

DATA = Path(__file__).parent / "data"
REPO_ROOT = Path(__file__).parents[2]


def tiny_args(output_dir: Path, **flags: str) -> list[str]:
    """chat_rl flags: the tiny model and data/'s rows, 2 prompts x 8 samples per step in passes of 4, 48 tokens;
    `flags` add or override (``eval_every="2"``)."""
    base = {
        "model_source": str(DATA / "nanochat"),
        "trust_pickle": "true",
        "gsm8k_source": "files",
        "train_data_files": str(DATA / "gsm8k_train.parquet"),
        "eval_data_files": str(DATA / "gsm8k_test.parquet"),
        "examples_per_step": "2",
        "num_samples": "8",
        "device_batch_size": "4",
        "max_new_tokens": "48",
        "eval_every": "-1",
        "save_every": "-1",
        "polar_dtype": "float32",
        "output_dir": str(output_dir),
    }
    return [part for key, value in {**base, **flags}.items() for part in (f"--{key}", value)]
