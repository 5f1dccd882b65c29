"""Pretrain nanochat's GPT as nanochat HEAD's base_train.py does:
`accelerate launch scripts/base_train.py configs/base_d24.yaml [--flag value ...]`.

`python scripts/base_train.py configs/base_demo.yaml`: a small model on synthetic shards (CPU, offline, minutes).
See `BaseTrainingArguments` (src/nanochat_hf/training/base_arguments.py) for every flag.
"""

from nanochat_hf.training.base_cli import answer_quickly

if __name__ == "__main__":
    answer_quickly()  # --help, --version and argument errors before torch and transformers are imported
    from nanochat_hf.training.base_run import main

    main()
