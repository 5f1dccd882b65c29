"""nanochat's GPT as a transformers model (config, backbone, causal LM, sequence classification). The classes are
imported on first use (see `nanochat_hf.lazy`), so the configuration file alone imports without the modeling stack;
importing the modeling file registers the model with the transformers Auto classes (see `nanochat_hf`)."""

from __future__ import annotations

from ..lazy import lazy_exports

_WHERE = {
    "NanoChatGPTConfig": "configuration_nanochat_gpt",
    **dict.fromkeys(
        (
            "NanoChatGPTForCausalLM",
            "NanoChatGPTForSequenceClassification",
            "NanoChatGPTModel",
            "NanoChatGPTPreTrainedModel",
        ),
        "modeling_nanochat_gpt",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
__all__ = list(_WHERE)
