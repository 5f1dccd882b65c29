"""The optimizer-state files of a checkpoint, in one place, readable by any number of processes.

Each rank writes ``optimizer.rank<r>.safetensors``: the state it holds, per parameter NAME, each tensor recorded as
rows [start, end) of the parameter's whole state tensor of n rows (the layout rule of optim/: `rows_per_rank` for
sharded rows, whole tensors on their owner or on every rank; seam.md point 1), plus the groups (names, parameter
names, settings), the recipe and the world size as JSON metadata. No pickles. A run of W' processes reads every
rank's file's header (`read_optimizer_checkpoint`, which checks that the files are one complete set) and reads only
the rows the layout gives it at W' (`load_full_state`: the same slicing as a warm start from nanochat's files;
safetensors slices, so no rank holds more than its part), so a checkpoint of W processes resumes on W' exactly:
every number is copied, none recomputed.
The scheduler is JSON (SCHEDULER_FILE). The mixin and MidTrainer write and read them; conversion/ turns them into
nanochat's ``optim_<step>_rank<r>.pt``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from ..atomic import replacing
from ..errors import UserError
from ..optim import RECIPES, MuonAdamW, NorMuonAdamW
from ..optim.reduction import rows_per_rank

OPTIMIZER_FILE = "optimizer.rank{rank}.safetensors"  # this rank's optimizer shard
SCHEDULER_FILE = "scheduler.json"
FORMAT = "rows-by-name/1"  # written into every file; another value (or none: an older nanochat-hf) is refused
FullState = dict[str, dict[str, Any]]  # parameter name -> {"step": int, "exp_avg": whole tensor or OnDisk, ...}
_NOT_STATE = ("params", "polar_dtype")  # group entries that are not saved settings (polar_dtype: this machine's)


def json_encode(obj: Any) -> Any:
    """JSON-encode python values, keeping tuples distinguishable from lists."""
    if isinstance(obj, tuple):
        return {"__tuple__": [json_encode(x) for x in obj]}
    if isinstance(obj, list):
        return [json_encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): json_encode(v) for k, v in obj.items()}
    return obj


def json_decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(json_decode(x) for x in obj["__tuple__"])
        return {k: json_decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_decode(x) for x in obj]
    return obj


def inner_optimizer(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps ours


def recipe_of(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer recipe (optim.RECIPES) an optimizer of build_optimizer runs."""
    return RECIPES[1] if isinstance(inner_optimizer(optimizer), NorMuonAdamW) else RECIPES[0]


def param_key(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's module., torch.compile's _orig_mod.)."""
    return name.removeprefix("module.").removeprefix("_orig_mod.")


def param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): param_key(n) for n, p in model.named_parameters()}


def _groups(optimizer: MuonAdamW, names: dict[int, str]) -> list[dict[str, Any]]:
    """The param groups with parameter names for indices, settings as they are (JSON-able)."""
    return [
        {**{k: v for k, v in g.items() if k not in _NOT_STATE}, "params": [names[id(p)] for p in g["params"]]}
        for g in optimizer.param_groups
    ]


def _rank_rows(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> tuple[dict, dict, dict]:
    """This rank's state as (tensors, rows, scalars) keyed "<parameter name>/<state key>": each tensor is rows
    [start, end) of a whole tensor of n rows (``rows[key] = [start, end, n]``)."""
    opt, names = inner_optimizer(optimizer), param_names(model)
    tensors, rows, scalars = {}, {}, {}
    for group in opt.param_groups:
        params = group["params"]
        # a NorMuon stack of matrices keeps its state on its first parameter; MoE expert stacks (3-D), like every
        # other parameter, keep their own (this rank's experts' rows)
        if group["kind"] == "muon" and isinstance(opt, NorMuonAdamW) and params[0].ndim == 2:
            _, start, end = opt._muon_chunk(group)
            for key, buf in opt.state.get(params[0], {}).items():
                for j, p in enumerate(params[start:end]):  # matrix j of this rank's chunk: a whole matrix
                    tensors[f"{names[id(p)]}/{key}"] = buf[j]
            continue
        for p in params:
            for key, value in opt.state.get(p, {}).items():
                name = f"{names[id(p)]}/{key}"
                if not torch.is_tensor(value):
                    scalars[name] = value
                elif value.shape[0] != p.shape[0] or value.ndim != p.ndim:  # this rank's rows of dim 0
                    _, start, end = rows_per_rank(p.shape[0], opt.world_size, opt.rank)
                    if value.shape[0] != end - start:
                        raise RuntimeError(f"{name}: {value.shape[0]} rows held, the layout gives [{start}, {end})")
                    tensors[name], rows[name] = value, [start, end, p.shape[0]]
                else:
                    tensors[name] = value
    for name, value in tensors.items():
        rows.setdefault(name, [0, value.shape[0], value.shape[0]])
    return tensors, rows, scalars


def _by_name(items: dict[str, Any]) -> FullState:
    full: FullState = {}
    for name, value in items.items():
        param, key = name.rsplit("/", 1)
        full.setdefault(param, {})[key] = value
    return full


def full_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> FullState:
    """The state of a one-process optimizer by parameter name (whole tensors, float32): what a checkpoint holds."""
    if inner_optimizer(optimizer).world_size != 1:
        raise ValueError("full_state needs the optimizer of one process (read a checkpoint's files instead)")
    tensors, _, scalars = _rank_rows(optimizer, model)
    return _by_name({**{k: v.float() for k, v in tensors.items()}, **scalars})


def save_optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, path: str | Path) -> None:
    """This rank's optimizer state -> one safetensors file, readable by any world size (module docstring)."""
    opt = inner_optimizer(optimizer)
    tensors, rows, scalars = _rank_rows(opt, model)
    meta = {
        "format": FORMAT,
        "recipe": recipe_of(opt),
        "world_size": str(opt.world_size),
        "rank": str(opt.rank),
        "groups": json.dumps(json_encode(_groups(opt, param_names(model)))),
        "rows": json.dumps(rows),
        "scalars": json.dumps(json_encode(scalars)),
    }
    with replacing(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)


@dataclass
class OnDisk:
    """A whole state tensor as the rank files hold it, in row pieces; only the rows asked for are read."""

    shape: tuple[int, ...]
    pieces: list[tuple[int, int, Path, str]]  # (start, end, file, tensor name), covering rows [0, n) in order

    def rows(self, start: int, end: int) -> Tensor:
        parts = []
        for s, e, path, name in self.pieces:
            if max(start, s) < min(end, e):
                with safe_open(str(path), framework="pt") as f:
                    parts.append(f.get_slice(name)[max(start, s) - s : min(end, e) - s])
        if not parts:  # a rank that owns none of the rows (dim 0 shorter than the world)
            return torch.zeros((0, *self.shape[1:]))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def whole(self) -> Tensor:
        return self.rows(0, self.shape[0])


def _rows(value: Tensor | OnDisk, start: int, end: int) -> Tensor:
    return value.rows(start, end) if isinstance(value, OnDisk) else value[start:end]


def _whole(value: Tensor | OnDisk) -> Tensor:
    return value.whole() if isinstance(value, OnDisk) else value


@dataclass
class SavedOptimizer:
    """A checkpoint's optimizer state as every rank's file holds it (tensors `OnDisk`, read where needed)."""

    recipe: str
    world_size: int
    groups: list[dict[str, Any]]  # settings, with parameter names in "params"
    full: FullState
    where: Path  # the folder, for messages

    def whole_state(self) -> FullState:
        """Every tensor read whole (what conversion/ writes out as nanochat's files)."""
        return {name: {k: _whole(v) for k, v in st.items()} for name, st in self.full.items()}


def _metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise UserError(f"{path}: not a readable optimizer file ({str(e).splitlines()[0][:200]})") from None
    if meta.get("format") != FORMAT:
        raise UserError(
            f"{path}: optimizer state in another format ({meta.get('format', 'an older nanochat-hf')!r}, this "
            f"version reads {FORMAT!r}): resume it with the nanochat-hf version that wrote it"
        )
    return meta


def read_optimizer_checkpoint(directory: str | Path) -> SavedOptimizer | None:
    """Every rank's optimizer file of a checkpoint folder, checked to be one complete set and put together (None:
    the folder holds no optimizer state). A missing rank's file or files of different runs: one line."""
    directory = Path(directory)
    first = directory / OPTIMIZER_FILE.format(rank=0)
    found = sorted(directory.glob(OPTIMIZER_FILE.format(rank="*")))
    if not found:
        return None
    if not first.is_file():
        raise UserError(f"{first}: missing (found {found[0].name}): a partial checkpoint, each rank writes its file")
    meta0 = _metadata(first)
    world = int(meta0["world_size"])
    metas = [meta0]
    for r in range(1, world):
        path = directory / OPTIMIZER_FILE.format(rank=r)
        if not path.is_file():
            raise UserError(
                f"{path}: missing: a partial checkpoint ({world} processes wrote it, each its own optimizer file)"
            )
        metas.append(_metadata(path))
        if (metas[-1]["world_size"], metas[-1]["groups"]) != (meta0["world_size"], meta0["groups"]):
            raise UserError(f"{path}: written by another run than {first.name} (other world size or groups)")
    pieces: dict[str, list[tuple[int, int, Path, str]]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    scalars: dict[str, Any] = {}
    for r, meta in enumerate(metas):
        path = directory / OPTIMIZER_FILE.format(rank=r)
        with safe_open(str(path), framework="pt") as f:
            for name, (start, end, n) in json.loads(meta["rows"]).items():
                if start == 0 and end == n and name in pieces:
                    continue  # a whole tensor every rank holds (replicated): rank 0's
                pieces.setdefault(name, []).append((start, end, path, name))
                shapes[name] = (n, *f.get_slice(name).get_shape()[1:])
        for name, value in json_decode(json.loads(meta["scalars"])).items():
            scalars.setdefault(name, value)  # (a step count every rank holding the parameter's rows keeps)
    tensors = {}
    for name, parts in pieces.items():
        parts.sort(key=lambda part: part[0])
        if [s for s, *_ in parts] != [0, *(e for _, e, *_ in parts[:-1])] or parts[-1][1] != shapes[name][0]:
            raise UserError(f"{directory}: the ranks' rows of {name} do not cover it: a damaged checkpoint")
        tensors[name] = OnDisk(shapes[name], parts)
    groups = json_decode(json.loads(meta0["groups"]))
    return SavedOptimizer(meta0["recipe"], world, groups, _by_name({**tensors, **scalars}), directory)


def _check_same_model(saved: SavedOptimizer, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """One line unless ``saved`` is the state of this model under this grouping (the recipe, the groups in order
    with the same parameter names, the state of each parameter's size)."""
    opt, names = inner_optimizer(optimizer), param_names(model)
    ours = _groups(opt, names)
    where = f"{saved.where / OPTIMIZER_FILE.format(rank=0)}"
    if saved.recipe != recipe_of(opt):
        raise UserError(f"{where}: optimizer state of recipe {saved.recipe}, this run's is {recipe_of(opt)}")
    mine, theirs = [(g["name"], g["params"]) for g in ours], [(g["name"], g["params"]) for g in saved.groups]
    if mine != theirs:
        i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        said = [f"{g[0]!r} with {len(g[1])} parameters" if g else "none" for g in (_at(theirs, i), _at(mine, i))]
        raise UserError(
            f"{where}: a checkpoint of another model or grouping: its param group {i} is {said[0]}, this run's is "
            f"{said[1]}"
        )
    numel = {names[id(p)]: p.numel() for p in model.parameters()}
    for name, state in saved.full.items():
        for key in ("exp_avg", "momentum_buffer"):
            if key in state and math.prod(state[key].shape) != numel[name]:
                raise UserError(
                    f"{where}: {key} of {name} has {tuple(state[key].shape)}, this model's parameter "
                    f"{numel[name]} elements: a checkpoint of another model"
                )


def _at(items: list, i: int) -> Any:
    return items[i] if i < len(items) else None


def load_full_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, full: FullState) -> None:
    """Put a full state into ``optimizer`` (either recipe, any world size): this rank's part of it, float32."""
    optimizer, names = inner_optimizer(optimizer), param_names(model)
    optimizer.state.clear()
    for group in optimizer.param_groups:
        params = group["params"]
        if group["kind"] == "muon" and params[0].ndim == 3:  # MoE expert stacks: this rank's experts, every buffer
            for p in params:
                st = full.get(names[id(p)])
                if st is not None:
                    _, start, end = optimizer._rows(p)
                    optimizer.state[p] = {
                        k: _rows(v, start, end).to(p.device, torch.float32, copy=True) for k, v in st.items()
                    }
        elif group["kind"] == "adamw":
            for p in params:
                st = full.get(names[id(p)])
                if st is None:
                    continue
                whole = optimizer._plan(p) == ("whole",)  # replicated on every rank, else rows (optim/)
                _, start, end = (0, 0, p.shape[0]) if whole else optimizer._rows(p)
                optimizer.state[p] = {
                    "step": st["step"],
                    **{
                        k: _rows(st[k], start, end).to(p.device, torch.float32, copy=True)
                        for k in ("exp_avg", "exp_avg_sq")
                    },
                }
        elif isinstance(optimizer, NorMuonAdamW):
            if not any(names[id(p)] in full for p in params):
                continue
            _, start, end = optimizer._muon_chunk(group)
            st = optimizer._muon_state(group)
            for key, buf in st.items():
                for j, p in enumerate(params[start:end]):
                    value = full.get(names[id(p)], {}).get(key)
                    if value is not None:  # a G0 file has no second moment: NorMuon starts it at 0
                        buf[j].copy_(_whole(value).reshape(buf[j].shape))
        else:
            for p in params:
                value = full.get(names[id(p)], {}).get("momentum_buffer")
                if value is not None and optimizer._plan(p) == ("owner", optimizer.rank):
                    optimizer.state[p] = {"momentum_buffer": _whole(value).to(p.device, torch.float32, copy=True)}


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, directory: str | Path) -> None:
    """Resume ``optimizer`` (built, not yet stepped; any world size) from a checkpoint folder's optimizer files:
    this rank's part of the state and every group's settings (all but polar_dtype, this machine's choice)."""
    saved = read_optimizer_checkpoint(directory)
    if saved is None:
        missing = OPTIMIZER_FILE.format(rank="<r>")
        raise UserError(f"{directory}: no {missing}: not a checkpoint of nanochat's optimizer")
    _check_same_model(saved, optimizer, model)
    load_full_state(optimizer, model, saved.full)
    for group, settings in zip(inner_optimizer(optimizer).param_groups, saved.groups):
        group.update({k: v for k, v in settings.items() if k not in _NOT_STATE})
