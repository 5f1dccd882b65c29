"""Mid-train a nanochat model: `accelerate launch scripts/mid_train.py [configs/x.yaml] [--flag value ...]`.

With no arguments: a small model from scratch on the offline demo mixture (CPU, a few minutes).
See `MidTrainingArguments` (src/nanochat_hf/training/arguments.py) for every flag.
"""

from nanochat_hf.training.cli import answer_quickly

if __name__ == "__main__":
    answer_quickly()  # --help, --version and argument errors before torch and transformers are imported
    from nanochat_hf.training.run import main

    main()
