"""nanochat's GPT as a transformers model (config + causal LM)."""

from .configuration_nanochat_gpt import NanoChatGPTConfig
from .modeling_nanochat_gpt import NanoChatGPTForCausalLM, NanoChatGPTPreTrainedModel

__all__ = ["NanoChatGPTConfig", "NanoChatGPTForCausalLM", "NanoChatGPTPreTrainedModel"]
