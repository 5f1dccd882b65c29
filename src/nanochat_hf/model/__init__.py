"""nanochat's GPT as a transformers model (config, backbone, causal LM, sequence classification)."""

from .configuration_nanochat_gpt import NanoChatGPTConfig
from .modeling_nanochat_gpt import (
    NanoChatGPTForCausalLM,
    NanoChatGPTForSequenceClassification,
    NanoChatGPTModel,
    NanoChatGPTPreTrainedModel,
)

__all__ = [
    "NanoChatGPTConfig",
    "NanoChatGPTForCausalLM",
    "NanoChatGPTForSequenceClassification",
    "NanoChatGPTModel",
    "NanoChatGPTPreTrainedModel",
]
