"""MidTrainer overrides a few private `transformers.Trainer` hooks (checkpoint pieces per rank and in safetensors,
the sharded optimizer's gradient contract, the checkpoint push), each with a one-line reason above it. If
transformers renamed or dropped one, stopped calling it, or changed its arguments, our override would silently stop
being called: these tests fail instead, naming the hook. A new private override must be listed here."""

from __future__ import annotations

import inspect
from functools import cached_property

import pytest
import transformers.trainer
from transformers import Trainer, TrainingArguments

from nanochat_hf.integration import NanoChatOptimizerMixin
from nanochat_hf.training.arguments import MidTrainingArguments
from nanochat_hf.training.base import BaseTrainer
from nanochat_hf.training.ddp_timeout import DDPTimeoutOnEveryBackendMixin
from nanochat_hf.training.trainer import MidTrainer, NanoChatTrainer

# every private Trainer method NanoChatTrainer overrides (MidTrainer and BaseTrainer, its subclasses, add none; the
# reason for each is the comment line above it)
PRIVATE_HOOKS = {
    "_save_checkpoint",
    "_push_from_checkpoint",
    "_save_optimizer_and_scheduler",
    "_save_rng_state",
    "_load_optimizer_and_scheduler",
    "_load_rng_state",
}
# every private Trainer method NanoChatOptimizerMixin (MidTrainer's base, and any Trainer's) overrides
MIXIN_HOOKS = {
    "_clip_grad_norm",
    "_get_grad_norm",
    "_save_optimizer_and_scheduler",
    "_load_optimizer_and_scheduler",
    "_load_from_checkpoint",
    "_validate_args",
}
# public, but called by the stock _save_checkpoint and push_to_hub with a private argument (_internal_call)
PINNED_PUBLIC = {"save_model"}


def _private_methods(cls: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(cls).items()
        if name.startswith("_") and not name.startswith("__") and callable(value)
    }


@pytest.mark.parametrize(
    "cls, hooks",
    [
        (NanoChatTrainer, PRIVATE_HOOKS),
        (MidTrainer, set()),
        (BaseTrainer, set()),
        (NanoChatOptimizerMixin, MIXIN_HOOKS),
    ],
)
def test_the_private_overrides_are_the_listed_ones_each_with_its_reason(cls, hooks):
    ours = _private_methods(cls)
    assert set(ours) == hooks, f"private methods now {sorted(ours)}: list (and justify) or remove them"
    for name, method in ours.items():
        reason = (inspect.getcomments(method) or "\n").splitlines()[-1]  # the comment line right above the def
        assert reason.startswith("# private hook: "), f"{name}: no one-line reason above it"


def test_every_private_override_is_a_trainer_hook_it_still_calls_with_the_same_arguments():
    stock_source = inspect.getsource(transformers.trainer)
    for name in sorted(PRIVATE_HOOKS | MIXIN_HOOKS | PINNED_PUBLIC):
        assert hasattr(Trainer, name), f"transformers.Trainer has no {name} any more: MidTrainer's override is dead"
        assert f"self.{name}(" in stock_source, f"transformers.Trainer no longer calls {name}: our override is dead"
        theirs = list(inspect.signature(getattr(Trainer, name)).parameters)
        for cls in (MidTrainer, NanoChatOptimizerMixin):
            if hasattr(cls, name):
                ours = list(inspect.signature(getattr(cls, name)).parameters)
                assert ours == theirs, f"{cls.__name__}.{name}: Trainer.{name} now takes {theirs}"
        ours = list(inspect.signature(getattr(MidTrainer, name)).parameters)
        assert ours == theirs, f"Trainer.{name} now takes {theirs}"


def test_training_arguments_setup_devices_is_still_the_cached_property_we_extend():
    # DDPTimeoutOnEveryBackendMixin (ddp_timeout.py) wraps it to give gloo the ddp_timeout, then calls super()'s
    theirs = inspect.getattr_static(TrainingArguments, "_setup_devices", None)
    assert isinstance(theirs, cached_property), "TrainingArguments._setup_devices is no longer a cached_property"
    ours = inspect.getattr_static(DDPTimeoutOnEveryBackendMixin, "_setup_devices")
    assert (inspect.getcomments(ours.func) or "").startswith("# private hook: ")
    assert MidTrainingArguments.__mro__.index(DDPTimeoutOnEveryBackendMixin) < MidTrainingArguments.__mro__.index(
        TrainingArguments
    )
