"""Deprecated: the Trainer mixin's old home. It moved to `nanochat_hf.integration` (with the gradient contract, the
momentum callback and the checkpoint files it uses); this module re-exports what it exported, with a FutureWarning
naming the new import, so that code written against the old path keeps working. Nothing in the package imports it.

The one module of optim/ that imports a layer above its own (tests/test_layering.py names it as the exception)."""

import warnings

from ..integration.mixin import NanoChatOptimizerMixin, check_distributed_setup

warnings.warn(
    "nanochat_hf.optim.trainer_mixin is deprecated and will be removed: import from nanochat_hf.integration instead "
    "(from nanochat_hf.integration import NanoChatOptimizerMixin, check_distributed_setup)",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["NanoChatOptimizerMixin", "check_distributed_setup"]
