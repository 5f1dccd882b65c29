"""`ddp_timeout` on every backend, CPU/gloo included.

transformers 5.x `TrainingArguments._setup_devices` builds Accelerate's `PartialState` with
`timeout=timedelta(seconds=ddp_timeout)` only when `use_cpu` is False (and `ACCELERATE_USE_CPU` unset); with
`use_cpu` it passes `cpu=True, backend=ddp_backend` and no timeout, so `PartialState.__init__` calls
`torch.distributed.init_process_group(backend="gloo", rank=..., world_size=...)` with torch's 30-minute default:
a frozen rank hangs the others for half an hour. `PartialState` forwards any extra kwargs to
`init_process_group`, and skips that call when a group already exists, so creating it first with the timeout
(exactly as `_setup_devices` would, plus the timeout) makes the later `_setup_devices` reuse our group.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import parse_flag_from_env


class DDPTimeoutOnEveryBackendMixin:
    """Put before `TrainingArguments` in the bases of a `TrainingArguments` subclass."""

    # private hook: the one place TrainingArguments creates the process group (on CPU without the timeout)
    @cached_property
    def _setup_devices(self) -> torch.device:
        cpu = self.use_cpu or parse_flag_from_env("ACCELERATE_USE_CPU")
        configured = getattr(self.accelerator_config, "use_configured_state", False)  # then the user's state is kept
        if cpu and not configured and not torch.distributed.is_initialized():
            AcceleratorState._reset_state(reset_partial_state=True)  # as super() does first, so the call below runs
            # Same call as transformers' CPU branch, plus the timeout it leaves out; no group without WORLD_SIZE > 1.
            PartialState(cpu=True, backend=self.ddp_backend, timeout=timedelta(seconds=self.ddp_timeout))
        return super()._setup_devices
