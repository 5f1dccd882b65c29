"""Checkpoint conversion: nanochat <-> our Hugging Face model -> transformers' native NanoChat, ONNX."""

from .nanochat import (
    find_nanochat_checkpoint,
    from_nanochat,
    load_from_nanochat,
    nanochat_tokenizer_dir,
    read_nanochat_checkpoint,
    to_nanochat,
)
from .native import native_config, read_hf_model, to_native
from .onnx import to_onnx

__all__ = [
    "find_nanochat_checkpoint",
    "from_nanochat",
    "load_from_nanochat",
    "nanochat_tokenizer_dir",
    "native_config",
    "read_hf_model",
    "read_nanochat_checkpoint",
    "to_nanochat",
    "to_native",
    "to_onnx",
]
