"""nanochat's GPT and mid-training on the Hugging Face stack.

Importing the package registers the model with the transformers Auto classes, and marks it for remote code so
``save_pretrained`` writes an ``auto_map`` plus the (standalone) configuration and modeling files.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .model import NanoChatGPTConfig, NanoChatGPTForCausalLM, NanoChatGPTForSequenceClassification, NanoChatGPTModel

AutoConfig.register(NanoChatGPTConfig.model_type, NanoChatGPTConfig, exist_ok=True)
AutoModel.register(NanoChatGPTConfig, NanoChatGPTModel, exist_ok=True)
AutoModelForCausalLM.register(NanoChatGPTConfig, NanoChatGPTForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(NanoChatGPTConfig, NanoChatGPTForSequenceClassification, exist_ok=True)
NanoChatGPTConfig.register_for_auto_class()
NanoChatGPTModel.register_for_auto_class("AutoModel")
NanoChatGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
NanoChatGPTForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = ["NanoChatGPTConfig", "NanoChatGPTForCausalLM", "NanoChatGPTForSequenceClassification", "NanoChatGPTModel"]
