"""nanochat's GPT and mid-training on the Hugging Face stack.

Importing the package is light (no torch, no transformers), so that every command answers --help and argument
errors at once: the model classes are imported on first use (``from nanochat_hf import NanoChatGPTForCausalLM``
works as before). The model is registered with the transformers Auto classes, and marked for remote code so
``save_pretrained`` writes an ``auto_map`` plus the (standalone) configuration and modeling files, as soon as a side
is loaded: when our modeling file is imported, or when transformers loads its Auto classes after ``import
nanochat_hf`` (a hook on those imports), so ``import nanochat_hf`` then ``AutoModelForCausalLM`` finds the model.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_MODEL_NAMES = (
    "NanoChatGPTConfig",
    "NanoChatGPTForCausalLM",
    "NanoChatGPTForSequenceClassification",
    "NanoChatGPTModel",
)
__all__ = list(_MODEL_NAMES)

# transformers' modules holding the Auto classes' mappings: the config's and the models'
_AUTO_CONFIG, _AUTO_MODELS = "transformers.models.auto.configuration_auto", "transformers.models.auto.modeling_auto"


def __getattr__(name: str):
    """The model classes, imported on first use (PEP 562)."""
    if name in _MODEL_NAMES:
        from . import model

        return getattr(model, name)
    if name == "__version__":
        from importlib.metadata import version

        return version("nanochat-hf")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODEL_NAMES])


def _importing(name: str) -> bool:
    """Whether module `name` is being imported right now (in sys.modules, its code not yet run to the end)."""
    module = sys.modules.get(name)
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)


def register_config() -> None:
    """Register the config with AutoConfig (imports only the configuration file and transformers' config code)."""
    from transformers import AutoConfig

    from .model.configuration_nanochat_gpt import NanoChatGPTConfig

    AutoConfig.register(NanoChatGPTConfig.model_type, NanoChatGPTConfig, exist_ok=True)
    NanoChatGPTConfig.register_for_auto_class()


def register_models() -> None:
    """Register the config and the three model classes with the Auto classes (called by `nanochat_hf.model`)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from .model.configuration_nanochat_gpt import NanoChatGPTConfig
    from .model.modeling_nanochat_gpt import (
        NanoChatGPTForCausalLM,
        NanoChatGPTForSequenceClassification,
        NanoChatGPTModel,
    )

    register_config()
    AutoModel.register(NanoChatGPTConfig, NanoChatGPTModel, exist_ok=True)
    AutoModelForCausalLM.register(NanoChatGPTConfig, NanoChatGPTForCausalLM, exist_ok=True)
    AutoModelForSequenceClassification.register(NanoChatGPTConfig, NanoChatGPTForSequenceClassification, exist_ok=True)
    NanoChatGPTModel.register_for_auto_class("AutoModel")
    NanoChatGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    NanoChatGPTForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")


class _RegisterWithAutoClasses(importlib.abc.MetaPathFinder):
    """Registers the model once a module it needs has run to its end: the config when transformers' AutoConfig
    module loads, the models when its Auto model classes' module or our modeling file loads (not the former while
    our modeling file is being imported: that would be an import circle, and it registers once done)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _REGISTER_AFTER:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders, then hook its loader
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run_code = spec.loader.exec_module

        def exec_module(module) -> None:
            run_code(module)
            if name == _MODELING or not _importing(_MODELING):
                _REGISTER_AFTER[name]()

        spec.loader.exec_module = exec_module
        return spec


_MODELING = f"{__name__}.model.modeling_nanochat_gpt"
_REGISTER_AFTER = {_AUTO_CONFIG: register_config, _AUTO_MODELS: register_models, _MODELING: register_models}
if _AUTO_MODELS in sys.modules:  # transformers' Auto classes are already there: register now
    register_models()
elif _AUTO_CONFIG in sys.modules:
    register_config()
if not any(isinstance(f, _RegisterWithAutoClasses) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithAutoClasses())
