"""nanochat's mid-training on transformers' Trainer and Accelerate (`scripts/mid_train.py`)."""

from .arguments import MidTrainingArguments, parse_args
from .trainer import MidTrainer

__all__ = ["MidTrainer", "MidTrainingArguments", "parse_args"]
