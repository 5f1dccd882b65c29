"""MidTrainer overrides some private `transformers.Trainer` hooks (checkpoint files per rank and in safetensors, the
sharded optimizer's gradient contract, the final save). If transformers renamed or dropped one, or changed its
arguments, our override would silently stop being called: this test fails instead, naming the hook."""

from __future__ import annotations

import inspect
from functools import cached_property

from transformers import Trainer, TrainingArguments

from nanochat_hf.training.arguments import MidTrainingArguments
from nanochat_hf.training.ddp_timeout import DDPTimeoutOnEveryBackendMixin
from nanochat_hf.training.trainer import MidTrainer

# MidTrainer's private methods that are its own helpers, not Trainer hooks.
OWN_HELPERS = {"_barrier"}


def _private_methods(cls: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(cls).items()
        if name.startswith("_") and not name.startswith("__") and callable(value)
    }


def test_every_private_override_is_a_trainer_hook_with_the_same_arguments():
    ours = _private_methods(MidTrainer)
    assert set(ours) - OWN_HELPERS, "MidTrainer overrides no private hook: this test is stale"
    for name, method in ours.items():
        if name in OWN_HELPERS:
            assert not hasattr(Trainer, name), f"transformers.Trainer now has {name}: our helper overrides it"
            continue
        assert hasattr(Trainer, name), f"transformers.Trainer has no {name} any more: MidTrainer's override is dead"
        theirs = list(inspect.signature(getattr(Trainer, name)).parameters)
        assert list(inspect.signature(method).parameters) == theirs, f"Trainer.{name} now takes {theirs}"


def test_training_arguments_setup_devices_is_still_the_cached_property_we_extend():
    # DDPTimeoutOnEveryBackendMixin (ddp_timeout.py) wraps it to give gloo the ddp_timeout, then calls super()'s
    theirs = inspect.getattr_static(TrainingArguments, "_setup_devices", None)
    assert isinstance(theirs, cached_property), "TrainingArguments._setup_devices is no longer a cached_property"
    assert MidTrainingArguments.__mro__.index(DDPTimeoutOnEveryBackendMixin) < MidTrainingArguments.__mro__.index(
        TrainingArguments
    )
