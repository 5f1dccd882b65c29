"""nanochat HEAD's SFT inheritance (scripts/chat_sft.py at 92d63d4): the batch geometry and the three LRs of the
base checkpoint's meta JSON are the defaults of a run that does not give them, and the optimizer warm-starts from
the base run's optimizer files (`warm_start_lines`).

nanochat reads max_seq_len, device_batch_size, total_batch_size from the meta's top level and embedding_lr,
unembedding_lr, matrix_lr from its `user_config` (base_train's arguments), and falls back to fixed numbers when a
field is missing. Here a missing field is an error naming the meta file and the fields (a silent fallback would
train with numbers the base model never saw). One addition: a meta written before total_batch_size was stored at
its top level (the December base_train, 790f3be) has it in `user_config`, where it is taken from.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..conversion import find_nanochat_checkpoint
from ..conversion.nanochat import NANOCHAT_META_FILE, available_steps
from ..errors import UserError
from ..jsonfile import read_json

# (argument, where nanochat's chat_sft.py reads it in the meta)
INHERITED = (
    ("max_seq_len", "meta"),
    ("device_batch_size", "meta"),
    ("total_batch_size", "meta"),
    ("embedding_lr", "user_config"),
    ("unembedding_lr", "user_config"),
    ("matrix_lr", "user_config"),
)


def find_meta(
    model_source: str | None, model_tag: str | None = None, step: int | None = None, checkpoint_source: str = "base"
) -> Path | None:
    """The meta JSON of the model `model_source` names (resolved as the run resolves it): a nanochat checkpoint's
    meta_<step>.json, a converted model's nanochat_meta.json; None for the demo model, a hub id or an HF dir
    converted without one."""
    if model_source in (None, "", "demo"):
        return None
    path = Path(model_source).expanduser()
    if not path.is_dir():
        return None
    if (path / "config.json").is_file():
        meta = path / NANOCHAT_META_FILE
        return meta if meta.is_file() else None
    if any(path.glob("model_*.pt")):  # a model tag directory
        checkpoint_dir, step = path, step if step is not None else available_steps(path)[-1]
    else:
        base = path if any(path.glob("*_checkpoints")) else path.parent
        checkpoint_dir, step = find_nanochat_checkpoint(base, source=checkpoint_source, model_tag=model_tag, step=step)
    return checkpoint_dir / f"meta_{step:06d}.json"


def _meta_value(meta: dict, name: str, where: str):
    user_config = meta.get("user_config") if isinstance(meta.get("user_config"), dict) else {}
    if where == "user_config":
        return user_config.get(name)
    value = meta.get(name)
    if (
        value is None
        and name == "total_batch_size"
        and isinstance(user_config.get(name), int)
        and user_config[name] > 0
    ):
        return user_config[name]  # the December meta: only base_train's argument (never -1 = auto there)
    return value


def inherit(meta_path: Path | None, given: set[str], model_source: str | None) -> dict:
    """The values to inherit: every INHERITED argument not in `given`, from the meta. ValueError (one line) when
    there is no meta or it lacks one of them (nothing has been written at this point)."""
    wanted = [(name, where) for name, where in INHERITED if name not in given]
    if not wanted:
        return {}
    names = ", ".join(name for name, _ in wanted)
    if meta_path is None:
        raise UserError(
            f"inherit_from_base: model_source={model_source!r} has no nanochat meta (meta_<step>.json "
            f"or {NANOCHAT_META_FILE}) to inherit {names} from; give them in the config or as flags"
        )
    meta = read_json(meta_path)
    values = {name: _meta_value(meta, name, where) for name, where in wanted}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise UserError(
            f"{meta_path}: no {', '.join(missing)} to inherit (nanochat's base_train writes "
            f"{', '.join(n for n, w in INHERITED if w == 'meta')} at the top level and the LRs in "
            f"user_config); give them in the config or as flags"
        )
    for name, value in values.items():
        is_int = name in ("max_seq_len", "device_batch_size", "total_batch_size")
        if isinstance(value, bool) or not isinstance(value, int if is_int else (int, float)) or value <= 0:
            raise UserError(
                f"{meta_path}: {name}={value!r} cannot be inherited (expected a positive "
                f"{'integer' if is_int else 'number'})"
            )
    return values


def inheritance_lines(args, inherited: dict, meta_path: Path | None) -> list[str]:
    """nanochat's report of where each of the six values came from, one line each."""
    meta = read_json(meta_path) if meta_path is not None else {}
    lines = []
    for name, where in INHERITED:
        value = getattr(args, name)
        if name in inherited:
            lines.append(f"inherited {name}={value} from {meta_path}")
            continue
        base = _meta_value(meta, name, where) if meta else None
        if base is not None and base != value:
            lines.append(f"{name}={value} overrides the base checkpoint's {base}")
        else:
            lines.append(f"using {name}={value}")
    return lines


def warm_start_lines(args) -> list[str]:
    """chat_sft.py's ``--load-optimizer 1`` (its default): the optimizer files beside the checkpoint model_source
    names (``optim_<step>_rank<r>.pt`` next to ``model_<step>.pt``) warm-start the run, when they are there. Sets
    ``args.nanochat_optimizer`` to rank 0's file (the trainer reads and checks every rank's before training);
    returns the lines that say what the run does. `args.load_optimizer` None: true with recipe 2026-07 (chat_sft.py),
    false with 2025-12 (the December mid_train.py never loads one)."""
    if args.nanochat_optimizer:
        if args.load_optimizer is False:
            raise UserError(f"load_optimizer=false and nanochat_optimizer={args.nanochat_optimizer} conflict: give one")
        return []
    wanted = args.optimizer_recipe == "2026-07" if args.load_optimizer is None else args.load_optimizer
    if not wanted:
        return []
    meta = find_meta(args.model_source, args.model_tag, args.step, args.checkpoint_source)
    step = re.fullmatch(r"meta_(\d+)\.json", meta.name) if meta is not None else None
    if step is None:  # the demo model, a hub id, a converted folder: no nanochat optimizer files
        if args.load_optimizer:
            raise UserError(
                f"load_optimizer=true: model_source={args.model_source!r} is not a nanochat checkpoint (its "
                "optimizer files optim_<step>_rank<r>.pt sit beside model_<step>.pt); give --nanochat_optimizer FILE"
            )
        return []
    path = meta.parent / f"optim_{step.group(1)}_rank0.pt"
    if not path.is_file():
        return [f"no optimizer file {path}: the optimizer starts fresh (chat_sft.py: slightly worse)"]
    args.nanochat_optimizer = str(path)
    return [f"warm-starting the optimizer from {path} as chat_sft.py does (--load_optimizer false: a fresh one)"]
