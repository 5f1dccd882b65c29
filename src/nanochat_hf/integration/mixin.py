"""nanochat's optimizer in any `transformers.Trainer` (TRL's SFTTrainer, DPOTrainer, GRPOTrainer, ...): one mixin.

    from nanochat_hf.integration import NanoChatOptimizerMixin

    class MySFT(NanoChatOptimizerMixin, SFTTrainer):
        pass

    trainer = MySFT(model=..., args=SFTConfig(...), train_dataset=..., nanochat_optimizer={"recipe": "2026-07"})

What the mixin changes, and nothing else:
- `create_optimizer`: `build_optimizer(model, **nanochat_optimizer)` (routing by role, see routing.py), the routing
  printed once as a table by the main process. The rates are build_optimizer's (``args.learning_rate`` is not
  read); the Trainer's LR schedule (``lr_scheduler_type``, warm-up) multiplies every group's rate in proportion.
- Muon's momentum warm-up 0.85 -> 0.95 over 300 steps (nanochat's), as a callback
  (`nanochat_hf.integration.MuonMomentumCallback`, usable on its own);
  ``muon_momentum_warmup=False`` leaves momentum at the optimizer's.
- gradients with several processes (the contract of integration/gradients.py, `LocalGradients`): the optimizer
  reduces each gradient onto the rank that owns it while backward runs (ZeRO-2), so DDP is told to leave them
  alone; a DDP that manages every parameter and already has a communication hook averages them instead, and the
  optimizer is told so (``grads_averaged = True``: it skips its own reduction). Clipping happens inside the
  optimizer, on the averaged gradient (``max_grad_norm``); the logged grad_norm is the optimizer's.
- the saved model is whole: a model FSDP2 shards is gathered before it is written (`save_model`, also inside
  checkpoints).
- checkpoints: each rank writes its part of the optimizer state as safetensors (the stock hook pickles rank 0's
  only), the scheduler as JSON; a resume on any number of processes reads every rank's file and keeps its part
  (integration/optimizer_state.py), after checking that they are one complete set of this model and grouping, and
  that the checkpoint's weights are the model's (`renamed_weights`: the stock resume only warns, and trains on
  restarted ones), converted where save_pretrained wrote them under other names (an MoE's experts one by one).
- every optimizer setting and the routing are checked when the Trainer is built (`check_optimizer_settings`).
- FSDP2 (Accelerate's ``fsdp_version: 2``, configs/accelerate_fsdp2.yaml, or a model the caller sharded with
  ``fully_shard``): the optimizer steps the sharded parameters (optim/fsdp.py); FSDP2 averages the gradients. With
  the caller's ``fully_shard``, a TRL reference model is sharded like the policy (`shard_like`) and a checkpoint's
  weights are loaded into the shards (saving.py; the stock resume fails on DTensors).
Refused in one line when the Trainer is built: DeepSpeed (flattened parameters; its own Muon is not nanochat's rule),
FSDP1 (flat parameters), an FSDP2 sharding the owner rule cannot handle (optim/fsdp.py) and GRPO's continuous
batching under FSDP2 (it ignores synced_gpus: a hang). docs/distributed.md, "TRL's trainers under FSDP2".
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..jsonfile import read_json, write_json
from ..optim.fsdp import fsdp_mesh
from ..optim.routing import build_optimizer, check_optimizer_settings
from .gradients import LocalGradients, clip_in_optimizer, reduces_gradients
from .momentum import MuonMomentumCallback
from .optimizer_state import (
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    inner_optimizer,
    load_optimizer_state,
    save_optimizer_state,
)
from .saving import is_sharded, load_whole_state_dict, own_class, safetensors_files, unsharded_class, whole_state_dict


def _few(names: list[str]) -> str:
    return str(names[:3])[:-1] + (f", ... {len(names) - 3} more]" if len(names) > 3 else "]")


def _misfit(model: torch.nn.Module, saved: set[str]) -> tuple[list[str], list[str]]:
    """(missing, unexpected): the model's tensors a checkpoint of these names lacks, and its names the model has not.
    A tied weight saved once (the head of a tied embedding) is present; a name the model leaves out on purpose
    (`_keys_to_ignore_on_save`) is not missing (the stock check's rule too)."""
    tensors = model.state_dict(keep_vars=True)
    present = {id(t) for name, t in tensors.items() if name in saved}
    unsaved = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    missing = [n for n, t in tensors.items() if n not in saved and id(t) not in present and n not in unsaved]
    return missing, sorted(saved - set(tensors))


def renamed_weights(model: torch.nn.Module, checkpoint: str) -> dict[str, torch.Tensor] | None:
    """A checkpoint's safetensors weights under the model's own names, in CPU memory, where they were saved under
    others; None where the names are the model's (the loaders by name do) or the folder has no safetensors weights
    (adapters, pickles: the stock loader's). transformers 5's save_pretrained writes some models under their hub
    checkpoint names, not the model's (MoE experts one by one where the model holds fused stacks, GPT-NeoX's head
    as embed_out): such a folder is read by from_pretrained, which converts it as it converts any hub checkpoint
    (stacks and splits: the same bits). Weights that still do not fit are refused in one line naming them, before
    anything is loaded: the stock resume loads what fits, warns, and trains on from restarted weights."""
    from safetensors import safe_open

    folder = Path(checkpoint)
    saved = set()
    for file in safetensors_files(folder):
        if not file.is_file():
            raise UserError(f"{file}: missing (listed in {folder}'s weight index): a partial checkpoint")
        with safe_open(file, framework="pt") as f:  # the header only
            saved.update(f.keys())
    model = getattr(model, "module", model)  # DDP's wrapper names every weight module.<name>
    if not saved or _misfit(model, saved) == ([], []):
        return None
    dtypes = {p.dtype for p in model.parameters()}  # loaded as trained (float32 holds any lower precision exactly)
    whole, info = own_class(model).from_pretrained(
        folder, config=copy.deepcopy(model.config), dtype=dtypes.pop() if len(dtypes) == 1 else torch.float32,
        output_loading_info=True, ignore_mismatched_sizes=True,  # mismatched: listed in info, refused below
    )  # fmt: skip
    missing, unexpected, mismatched = (sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    if missing or unexpected or mismatched:
        raise UserError(
            f"{folder}: its weights are not {own_class(model).__name__}'s (missing {_few(missing)}, unexpected "
            f"{_few(unexpected)}{f', other shapes {_few([m[0] for m in mismatched])}' if mismatched else ''}): "
            f"resuming would train from restarted weights"
        )
    return whole.state_dict()


def checkpoint_weights(model: torch.nn.Module, checkpoint: str) -> dict[str, torch.Tensor] | None:
    """All of a checkpoint's safetensors weights under the model's names (`renamed_weights`), in CPU memory; None
    where the folder has no safetensors weights (the stock loader's)."""
    from safetensors.torch import load_file

    if not (files := safetensors_files(Path(checkpoint))):
        return None
    renamed = renamed_weights(model, checkpoint)
    if renamed is not None:
        return renamed
    return {name: t for file in files for name, t in load_file(file).items()}


def check_distributed_setup(trainer: Any) -> None:
    """Refuse, in one line, what nanochat's optimizer cannot run under: DeepSpeed, FSDP1, an FSDP2 sharding other
    than Shard(0) on a 1-D mesh (optim/fsdp.py), and TRL's GRPO generating by continuous batching under FSDP2.
    FSDP2 and plain DDP are fine."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        raise UserError(
            "DeepSpeed is not supported with nanochat's optimizer: its ZeRO optimizers flatten the parameters (no "
            "matrices left for Muon), and DeepSpeed's own Muon is Keller Jordan's Muon + Adam rule, not nanochat's "
            "(Polar Express, NorMuon, cautious weight decay); launch without --deepspeed, with FSDP2 "
            "(configs/accelerate_fsdp2.yaml) or plain DDP"
        )
    from torch.distributed.fsdp import FullyShardedDataParallel

    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    fsdp1 = plugin is not None and getattr(plugin, "fsdp_version", 1) != 2
    if fsdp1 or any(isinstance(m, FullyShardedDataParallel) for m in trainer.model.modules()):
        raise UserError(
            "FSDP1 is not supported with nanochat's optimizer (its flat parameters leave no matrices for Muon); use "
            "FSDP2: fsdp_version: 2 in the Accelerate config (configs/accelerate_fsdp2.yaml) or fully_shard"
        )
    sharded = fsdp_mesh(trainer.model.named_parameters()) is not None or trainer.is_fsdp_enabled
    if sharded and getattr(trainer.args, "use_transformers_continuous_batching", False):  # TRL's GRPO
        raise UserError(
            "use_transformers_continuous_batching=True is not supported with FSDP2: transformers' continuous "
            "batching ignores synced_gpus, so a process done with its completions stops calling forward while the "
            "others wait in FSDP2's all-gathers (a hang); leave it False (generate() keeps the processes in step)"
        )


def shard_like(model: torch.nn.Module, other: Any, mesh: Any) -> None:
    """`fully_shard` `other` (a TRL trainer's reference model, whole) on `mesh` where FSDP2 shards `model`: the
    modules of the same names, innermost first, the root last; Accelerate's FSDP2 shards it in TRL (prepare_fsdp),
    the caller's `fully_shard` does not. Its parameters then pair with the policy's: 1/W of its memory, and TRL's
    sync_ref_model mixes shards with shards (with whole tensors DTensor refuses it). None: left; already sharded
    (by the caller): only resharded after forward, as below."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not isinstance(other, torch.nn.Module):
        return
    if not is_sharded(other):
        modules = dict(other.named_modules())
        for name in reversed([n for n, m in model.named_modules() if isinstance(m, FSDPModule)]):  # children first
            if name in modules:
                fully_shard(modules[name], mesh=mesh)
    if isinstance(other, FSDPModule):
        # FSDP2 keeps a root's parameters gathered after forward, for the backward a reference model never runs:
        # reshard them, so that they are shards again (and the whole copy freed) when sync_ref_model mixes them
        other.register_forward_hook(lambda module, args, output: module.reshard())


class NanoChatOptimizerMixin:
    """Put first among the bases: ``class MySFT(NanoChatOptimizerMixin, SFTTrainer)`` (module docstring).

    ``nanochat_optimizer``: keyword arguments of `build_optimizer` (rates, ``recipe``, ``roles``, ...).
    Subclasses may override `optimizer_settings` instead (nanochat's MidTrainer reads them from its arguments).
    """

    def __init__(
        self,
        *args: Any,
        nanochat_optimizer: dict[str, Any] | None = None,
        muon_momentum_warmup: bool = True,
        **kwargs: Any,
    ) -> None:
        self.nanochat_optimizer_kwargs = dict(nanochat_optimizer or {})
        super().__init__(*args, **kwargs)
        if (mesh := fsdp_mesh(self.model.named_parameters())) is not None and not self.is_fsdp_enabled:
            # sharded by the caller (fully_shard, as on CPU where Accelerate enables no FSDP): take the Trainer's
            # route for a model sharded at load time, which wraps nothing in DDP (DDP refuses DTensor parameters)
            self.is_distributed_loading_by_transformers = True
            shard_like(self.model, getattr(self, "ref_model", None), mesh)  # TRL's reference model (DPO, GRPO)
        if muon_momentum_warmup:
            self.add_callback(MuonMomentumCallback())
        self.add_callback(LocalGradients(self))  # before the Trainer wraps the model: DDP must not keep gradients

    # private hook: the stock no_sync of FSDP2 reads config.distributed_config, which a model fully_shard sharded lacks
    @contextmanager
    def _defer_fsdp_gradient_reduction(self) -> Iterator[None]:
        """The micro-batches of an accumulation but the last, under FSDP2: each rank sums their gradients unreduced,
        and the last micro-batch's reduce-scatter averages the sum (Accelerate's no_sync for its own FSDP2 does the
        same): the gradient of one process. Whole gradients meanwhile; reduce-scatter on every micro-batch instead
        (sharded ones) with ``accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}``."""
        if getattr(self.model.config, "distributed_config", None) is not None:  # sharded at load time: the stock way
            with super()._defer_fsdp_gradient_reduction():
                yield
            return
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    # The Trainer's own check of its arguments runs once the model is final (PEFT-wrapped, say) and before anything
    # is written (the output folder, a hub repo): the optimizer's settings and routing are checked with them.
    # private hook: the stock check of the constructor's arguments, where ours belongs (nothing written yet)
    def _validate_args(self) -> None:
        super()._validate_args()
        check_distributed_setup(self)  # first: FSDP1's flat parameters would read as "nothing for Muon" below
        check_optimizer_settings(self.model, **self.optimizer_settings())  # every mistake now, not at train()

    def optimizer_settings(self) -> dict[str, Any]:
        """`build_optimizer`'s keyword arguments."""
        return self.nanochat_optimizer_kwargs

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = build_optimizer(self.model, **self.optimizer_settings())
            clip_in_optimizer(self.optimizer, self.args.max_grad_norm)
            if self.is_world_process_zero():
                print(self.optimizer.routing.table(), flush=True)
        return self.optimizer

    # private hook: the stock step clips each rank's local gradients; ours clips the averaged one, in the optimizer
    def _clip_grad_norm(self, model: torch.nn.Module) -> None:
        """The optimizer clips in its step (see integration/gradients.py): the same norm at every world size."""
        return None

    # private hook: with several processes the stock norm of the local gradients is a wasted pass and meaningless
    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        """The stock norm with one process; with several the logged norm is the optimizer's (when it clips)."""
        if reduces_gradients(self.optimizer):
            return None
        return super()._get_grad_norm(model, grad_norm)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and (norm := getattr(inner_optimizer(self.optimizer), "last_grad_norm", None)) is not None:
            logs["grad_norm"] = norm  # the norm of the averaged gradient, measured by the optimizer as it clipped
        super().log(logs, start_time)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The stock save; a model FSDP2 shards outside Accelerate's FSDP (`fully_shard` under torchrun, e.g. on
        CPU, where Accelerate enables no FSDP) is first gathered whole (every process takes part) and the main
        process writes it: one ordinary folder, not each rank's shards."""
        state = None if self.is_fsdp_enabled else whole_state_dict(self.model)  # Accelerate's FSDP: the stock path
        if state is None:
            return super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            with unsharded_class(self.model):  # (a remote-code model's folder names its own class)
                self._save(output_dir or self.args.output_dir, state_dict=state)  # what the stock save_model calls
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    # private hook: the stock one pickles rank 0's optimizer state only; ours is sharded across ranks
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Each rank writes its part of the optimizer state (optimizer_state.py); the main process the scheduler."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        rank = self.accelerator.process_index
        save_optimizer_state(self.optimizer, self.model, out / OPTIMIZER_FILE.format(rank=rank))
        if self.args.should_save:
            write_json(out / SCHEDULER_FILE, self.lr_scheduler.state_dict())

    # FSDP2 (the caller's fully_shard, or Accelerate's, which calls this after sharding): the stock copy of whole
    # tensors into DTensors fails, and Accelerate's loader would read a pytorch_model_fsdp.bin never written
    # private hook: the stock resume loads a checkpoint by its saved names, warns about the rest, and fails on shards
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        """A model FSDP2 shards: the main process alone reads the checkpoint's weights (`checkpoint_weights`) and
        sends every process its rows; the others follow it, whatever they see of the folder. Otherwise weights saved
        under other names than the model's are converted (`renamed_weights`), and the stock loader loads the others
        by name. A checkpoint whose weights are not the model's is refused in one line, before anything is loaded."""
        model = self.model if model is None else model
        if is_sharded(model):
            # the main process alone looks at the folder, also to choose the path: another process may not see it
            # (another machine's disk) or not yet (the main process still writing it: "Can't find a valid
            # checkpoint" there, while the main process waited in the broadcast)
            if load_whole_state_dict(model, lambda: checkpoint_weights(model, resume_from_checkpoint)):
                return
        elif (renamed := renamed_weights(model, resume_from_checkpoint)) is not None:
            getattr(model, "module", model).load_state_dict(renamed, strict=False)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    # private hook: reads our files where the stock resume reads its pickles (optimizer built, not yet stepped)
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """This rank's part of the optimizer state, whatever the world size that saved it, and the schedule; a
        checkpoint of another model or grouping, or one with a rank's file missing, in one line."""
        if checkpoint is None:
            return
        schedule = Path(checkpoint) / SCHEDULER_FILE
        if not schedule.is_file():
            raise UserError(f"{schedule}: missing: a partial checkpoint")
        load_optimizer_state(self.optimizer, self.model, checkpoint)
        self.lr_scheduler.load_state_dict(read_json(schedule))
