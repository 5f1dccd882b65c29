"""nanochat's mid-training on transformers' Trainer and Accelerate (`scripts/mid_train.py`)."""

from ..lazy import lazy_exports

# imported on first use (see nanochat_hf.lazy): `nanochat_hf.training.device` alone needs no Trainer
__getattr__, __dir__ = lazy_exports(
    __name__, {"MidTrainingArguments": "arguments", "parse_args": "arguments", "MidTrainer": "trainer"}
)

__all__ = ["MidTrainer", "MidTrainingArguments", "parse_args"]
