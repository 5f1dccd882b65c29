"""nanochat's optimizer files (``optim_<step:06d>_rank<r>.pt``, one per rank) <-> our optimizer's state.

Two formats exist (docs/nanochat.md): the G0 era (790f3be) saves a list ``[AdamW state_dict, Muon state_dict]``
(one process: torch's fused AdamW and `Muon` with groups by matrix size; several: `DistAdamW`, rows of dim 0
sharded, and `DistMuon`, groups by sorted shape, matrix i owned by rank i % W); HEAD (92d63d4) saves one
`MuonAdamW.state_dict()` (groups of gpt.py setup_optimizer; the layout of `nanochat_hf.optim.head`).
Both are read into a "full" state by parameter name, {name: {"step", "exp_avg", "exp_avg_sq"}} (AdamW) or
{name: {"momentum_buffer"[, "second_momentum_buffer"]}} (Muon), float32, whole tensors; that is then sliced into
either recipe's optimizer for this rank (of any world size), or written back in either format. A HEAD file's group
settings (the base run's last scheduled Muon weight decay, betas, eps...) carry over into recipe 2026-07 with
`apply_settings`, all but the learning rates, as chat_sft.py's ``load_state_dict`` then LR reset does; a G0 file has
no settings of that recipe, so only its state moves. A file set with a rank missing, or of another model or
generation, is refused in one line naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from ..integration.optimizer_state import FullState, SavedOptimizer, load_full_state, param_key, param_names
from ..optim import MuonAdamW, NorMuonAdamW
from ..optim.head import SMALL_NUMEL
from ..optim.routing import ADAMW_GROUPS, head_group_of, nanochat_order

FILE_PATTERN = re.compile(r"optim_(\d+)_rank(\d+)\.pt")
Settings = dict[str, dict[str, Any]]  # parameter name -> the hyperparameters of its group in the file
_NOT_CARRIED = ("params", "lr", "initial_lr", "kind", "name", "polar_dtype")  # chat_sft.py resets the LRs only


def rank_files(path: str | Path) -> list[Path]:
    """Every rank's file of the step ``path`` (any rank's file) belongs to, in rank order (ranks 0..W-1)."""
    path = Path(path)
    match = FILE_PATTERN.fullmatch(path.name)
    if match is None:
        raise UserError(f"{path}: not a nanochat optimizer file name (expected optim_<step>_rank<r>.pt)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    found = {
        int(FILE_PATTERN.fullmatch(p.name).group(2)): p
        for p in path.parent.glob(f"optim_{match.group(1)}_rank*.pt")
        if FILE_PATTERN.fullmatch(p.name)
    }
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise UserError(
            f"{path.parent / f'optim_{match.group(1)}_rank{missing[0]}.pt'}: missing (found ranks "
            f"{sorted(found)}; nanochat writes one file per rank 0..W-1)"
        )
    return [found[r] for r in sorted(found)]


def _load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- pickle/zip errors of every kind: one line naming the file
        raise UserError(f"{path}: not a readable optimizer file ({str(e).strip().splitlines()[0][:200]})") from None


# ---- nanochat's parameter numbering ------------------------------------------------------------------------------
def _head_layout(model: torch.nn.Module) -> list[tuple[str, list[str]]]:
    """(kind, names) per group of nanochat HEAD's MuonAdamW for this model, in its order (all six AdamW groups,
    empty ones too, then one Muon group per sorted shape)."""
    named = [(param_key(n), p) for n, p in model.named_parameters() if p.requires_grad]
    by_group: dict[str, list[str]] = {}
    for n, _ in sorted(named, key=lambda item: nanochat_order(item[0])):
        by_group.setdefault(head_group_of(n), []).append(n)
    layout = [("adamw", by_group.get(name, [])) for name, *_ in ADAMW_GROUPS]
    shapes = {n: tuple(p.shape) for n, p in named}
    for shape in sorted({shapes[n] for n in by_group.get("muon", [])}):
        layout.append(("muon", [n for n in by_group["muon"] if shapes[n] == shape]))
    return layout


def _g0_layout(model: torch.nn.Module, world: int) -> tuple[list[str], list[list[str]]]:
    """G0's (AdamW names, Muon groups of names): AdamW [lm_head, wte]; Muon, one process: `Muon` groups by matrix
    size in the iteration order of the Python set nanochat built (ints: the same in every process); several:
    `DistMuon` groups by sorted shape."""
    named = [(param_key(n), p) for n, p in model.named_parameters() if p.requires_grad]
    unknown = [
        n
        for n, _ in named
        if n not in ("lm_head.weight", "transformer.wte.weight") and not n.startswith("transformer.h.")
    ]
    if unknown:
        raise UserError(
            f"parameter {unknown[0]!r}: a G0-era optimizer file has no state for it (G0 models have "
            "only transformer.h.*, transformer.wte.weight and lm_head.weight)"
        )
    matrices = [(n, p) for n, p in named if n.startswith("transformer.h.")]
    if world == 1:
        groups = [[n for n, p in matrices if p.numel() == size] for size in {p.numel() for _, p in matrices}]
    else:
        groups = [
            [n for n, p in matrices if tuple(p.shape) == s] for s in sorted({tuple(p.shape) for _, p in matrices})
        ]
    return ["lm_head.weight", "transformer.wte.weight"], groups


# ---- reading ----------------------------------------------------------------------------------------------------
def _check_groups(path: Path, saved: list[dict], expected: list[tuple[str, list[str]]]) -> None:
    got = [(g.get("kind", "muon" if "momentum" in g else "adamw"), len(g["params"])) for g in saved]
    want = [(kind, len(names)) for kind, names in expected]
    if got != want:
        raise UserError(
            f"{path}: its optimizer groups (kind, parameters) {got} do not match this model's {want}: "
            "a file of another model or generation"
        )


def _cat_rows(path: Path, pieces: list[Tensor], shape: tuple[int, ...], name: str) -> Tensor:
    full = torch.cat([p.float() for p in pieces]) if len(pieces) > 1 else pieces[0].float()
    if tuple(full.shape) != shape:
        raise UserError(
            f"{path}: state of {name} has shape {tuple(full.shape)} across {len(pieces)} rank files, "
            f"the model's parameter has {shape}: a file of another model or world size"
        )
    return full


def _adamw_full(path: Path, states: list[dict], name: str, shape: tuple[int, ...], replicated: bool) -> dict:
    states = states[:1] if replicated else states
    out = {"step": int(states[0]["step"])}
    for key in ("exp_avg", "exp_avg_sq"):
        out[key] = _cat_rows(path, [st[key] for st in states], shape, name)
    return out


def read_nanochat_optimizer(path: str | Path, model: torch.nn.Module) -> tuple[FullState, int, str]:
    """The full state of every rank's file of ``path``'s step: (state by name, world size W, format "g0"/"head")."""
    full, world, fmt, _ = read_warm_start(path, model)
    return full, world, fmt


def read_warm_start(path: str | Path, model: torch.nn.Module) -> tuple[FullState, int, str, Settings]:
    """`read_nanochat_optimizer`'s (state, W, format), and the group settings of a HEAD file by parameter name
    (rank 0's; every rank saves the same); {} for a G0 file."""
    files = rank_files(path)
    world = len(files)
    data = [_load(f) for f in files]
    shapes = {param_key(n): tuple(p.shape) for n, p in model.named_parameters()}
    full: FullState = {}
    if all(isinstance(d, dict) and "param_groups" in d for d in data):
        layout = _head_layout(model)
        for f, d in zip(files, data):
            _check_groups(f, d["param_groups"], layout)
        index = 0
        for kind, group in layout:
            for i, n in enumerate(group):
                states = [d["state"].get(index + i) for d in data]
                if kind == "adamw" and all(states):
                    small = world == 1 or torch.Size(shapes[n]).numel() < SMALL_NUMEL
                    full[n] = _adamw_full(files[0], states, n, shapes[n], small)
            states = [d["state"].get(index) for d in data]
            if kind == "muon" and group and all(states):
                for key in ("momentum_buffer", "second_momentum_buffer"):
                    stack = torch.cat([st[key].float() for st in states])[: len(group)]
                    if stack.shape[0] != len(group) or (
                        key == "momentum_buffer" and stack.shape[1:] != shapes[group[0]]
                    ):
                        raise UserError(
                            f"{files[0]}: {key} of the {shapes[group[0]]} matrices has shape "
                            f"{tuple(states[0][key].shape)}: a file of another model or world size"
                        )
                    for n, v in zip(group, stack):
                        full.setdefault(n, {})[key] = v.clone()
            index += len(group)
        settings = {
            n: {k: v for k, v in saved.items() if k not in _NOT_CARRIED}
            for saved, (_, group) in zip(data[0]["param_groups"], layout)
            for n in group
        }
        return full, world, "head", settings
    if not all(isinstance(d, list) and len(d) == 2 for d in data):
        raise UserError(
            f"{files[0]}: neither nanochat format (a MuonAdamW state_dict, or the G0-era list "
            "[AdamW state_dict, Muon state_dict])"
        )
    sharded = ["zero_buffer" in g for g in data[0][1]["param_groups"]]
    if any(sharded) != (world > 1):
        raise UserError(
            f"{files[0]}: written by {'several processes' if any(sharded) else 'one process'} but the "
            f"folder holds {world} rank file(s): a file set of another world size"
        )
    adamw_names, muon_groups = _g0_layout(model, world)
    for f, d in zip(files, data):
        _check_groups(f, d[0]["param_groups"], [("adamw", [n]) for n in adamw_names])
        _check_groups(f, d[1]["param_groups"], [("muon", g) for g in muon_groups])
    for i, n in enumerate(adamw_names):
        states = [d[0]["state"].get(i) for d in data]
        if all(states):
            full[n] = _adamw_full(files[0], states, n, shapes[n], world == 1)
    index = 0
    for group in muon_groups:
        for i, n in enumerate(group):
            st = data[i % world][1]["state"].get(index + i)  # DistMuon: matrix i of a group is rank i % W's
            if st is not None:
                full[n] = {"momentum_buffer": _cat_rows(files[i % world], [st["momentum_buffer"]], shapes[n], n)}
        index += len(group)
    return full, world, "g0", {}


def apply_settings(optimizer: MuonAdamW, model: torch.nn.Module, settings: Settings, path: str | Path) -> str:
    """Give each group of a recipe-2026-07 optimizer the settings its parameters had in the file (read by
    `read_warm_start`), all but the LRs, as chat_sft.py keeps them; returns what that made of the Muon weight decay
    ("" when nothing carries over: a G0 file, or recipe 2025-12, whose groups are not nanochat HEAD's)."""
    if not settings or not isinstance(optimizer, NorMuonAdamW):
        return ""
    names = param_names(model)
    for group in optimizer.param_groups:
        found = [settings[names[id(p)]] for p in group["params"] if names[id(p)] in settings]
        if any(f != found[0] for f in found):
            raise UserError(f"{path}: the parameters of our group {group['name']!r} have different settings there")
        group.update({k: v for k, v in (found[0] if found else {}).items() if k in group})
    decay = sorted({g["weight_decay"] for g in optimizer.param_groups if g["kind"] == "muon"})
    return f"Muon weight decay {', '.join(f'{d:.6g}' for d in decay)} from the base run"


def load_nanochat_optimizer(optimizer: MuonAdamW, model: torch.nn.Module, path: str | Path) -> str:
    """Warm-start ``optimizer`` from nanochat's optimizer files of ``path``'s step (every rank reads all of them and
    keeps its part, whatever the two world sizes; a HEAD file's settings but the LRs too, see `apply_settings`).
    Refused in one line, with nothing loaded, for an incomplete file set or one of another model or generation.
    Returns a line saying what was loaded."""
    full, _, fmt, settings = read_warm_start(path, model)
    load_full_state(optimizer, model, full)
    carried = apply_settings(optimizer, model, settings, path)
    return (
        f"optimizer warm-started from {path} ({fmt} format, {len(full)} parameters' state; LRs from this run"
        f"{'; ' + carried if carried else ''})"
    )


# ---- writing ----------------------------------------------------------------------------------------------------
def nanochat_files(
    model: torch.nn.Module,
    full: FullState,
    world: int,
    fmt: str,
    dtypes: dict[str, torch.dtype],
    groups: list[dict[str, Any]],
) -> list[Any]:
    """One object per rank as nanochat saves it, in format "head" or "g0"; state tensors in the dtype of the
    parameter in nanochat's model file (``dtypes``); ``groups``: our optimizer's param groups (hyperparameters)."""
    shapes = {param_key(n): tuple(p.shape) for n, p in model.named_parameters()}
    hyper = {g["name"]: g for g in groups}

    def part(n: str, t: Tensor, r: int, whole: bool) -> Tensor:
        if not whole:
            if shapes[n][0] % world:
                raise UserError(
                    f"{n}: {shapes[n][0]} rows do not split over {world} processes, which nanochat's "
                    "sharded AdamW needs"
                )
            k = shapes[n][0] // world
            t = t[r * k : (r + 1) * k]
        return t.to(dtypes[n]).clone()

    def adamw_state(n: str, r: int, whole: bool, step: Any) -> dict[str, Any]:
        return {"step": step, **{key: part(n, full[n][key], r, whole) for key in ("exp_avg", "exp_avg_sq")}}

    out = []
    if fmt == "head":
        layout = _head_layout(model)
        for r in range(world):
            state, pgroups, index = {}, [], 0
            for gi, (kind, names) in enumerate(layout):
                ids = list(range(index, index + len(names)))
                index += len(names)
                if kind == "adamw":
                    g = hyper.get(f"adamw/{ADAMW_GROUPS[gi][0]}", {"lr": 0.0, "initial_lr": 0.0})
                    pgroups.append(
                        {
                            "kind": "adamw",
                            "params": ids,
                            "lr": g["lr"],
                            "betas": ADAMW_GROUPS[gi][2],
                            "eps": 1e-10,
                            "weight_decay": ADAMW_GROUPS[gi][3],
                            "initial_lr": g["initial_lr"],
                        }
                    )
                    for i, n in zip(ids, names):
                        if n in full:
                            whole = world == 1 or torch.Size(shapes[n]).numel() < SMALL_NUMEL
                            state[i] = adamw_state(n, r, whole, full[n]["step"])
                    continue
                rows, cols = shapes[names[0]]
                g = hyper[f"muon/{rows}x{cols}"]
                pgroups.append(
                    {
                        "kind": "muon",
                        "params": ids,
                        "lr": g["lr"],
                        "momentum": g["momentum"],
                        "ns_steps": g["ns_steps"],
                        "beta2": g["beta2"],
                        "weight_decay": g["weight_decay"],
                        "initial_lr": g["initial_lr"],
                    }
                )
                if names[0] in full:
                    k = -(-len(names) // world)
                    st = {}
                    for key, shape in (
                        ("momentum_buffer", (rows, cols)),
                        ("second_momentum_buffer", (rows, 1) if rows >= cols else (1, cols)),
                    ):
                        st[key] = torch.zeros((k, *shape), dtype=dtypes[names[0]])
                        for j, n in enumerate(names[r * k : (r + 1) * k]):
                            if key in full[n]:  # a December state has no second moment: zeros, as a fresh one
                                st[key][j] = full[n][key].reshape(shape)
                    state[ids[0]] = st
            out.append({"state": state, "param_groups": pgroups})
        return out
    adamw_names, muon_groups = _g0_layout(model, world)
    muon = next((g for g in groups if g["kind"] == "muon"), {"lr": 0.02, "momentum": 0.95, "initial_lr": 0.02})
    for r in range(world):
        astate, apg = {}, []
        for i, n in enumerate(adamw_names):
            g = hyper.get("adamw/" + ("lm_head" if i == 0 else "wte"), {"lr": 0.0, "initial_lr": 0.0})
            apg.append(
                {
                    "params": [i],
                    "lr": g["lr"],
                    "betas": g.get("betas", (0.8, 0.95)),
                    "eps": g.get("eps", 1e-10),
                    "weight_decay": g.get("weight_decay", 0.0),
                    "initial_lr": g["initial_lr"],
                }
            )
            if n in full:  # torch's fused AdamW keeps a float32 step tensor, DistAdamW an int64 one
                step = torch.tensor(float(full[n]["step"])) if world == 1 else torch.tensor(full[n]["step"])
                astate[i] = adamw_state(n, r, world == 1, step)
        mstate, mpg, index = {}, [], 0
        for group in muon_groups:
            ids = list(range(index, index + len(group)))
            index += len(group)
            entry = {
                "params": ids,
                "lr": muon["lr"],
                "momentum": muon["momentum"],
                "nesterov": True,
                "ns_steps": 5,
                "initial_lr": muon["initial_lr"],
            }
            if world > 1:  # DistMuon keeps it in its groups (and needs it back when loading)
                entry["zero_buffer"] = torch.zeros(shapes[group[0]], dtype=dtypes[group[0]])
            mpg.append(entry)
            for j, (i, n) in enumerate(zip(ids, group)):
                if n in full and j % world == r:
                    mstate[i] = {"momentum_buffer": full[n]["momentum_buffer"].to(dtypes[n]).clone()}
        out.append([{"state": astate, "param_groups": apg}, {"state": mstate, "param_groups": mpg}])
    return out


def write_nanochat_optimizer(
    model: torch.nn.Module, saved: SavedOptimizer, directory: Path, step: int, dtypes: dict[str, torch.dtype]
) -> list[Path]:
    """A checkpoint's optimizer state (`read_optimizer_checkpoint`) as nanochat's ``optim_<step>_rank<r>.pt`` files
    in ``directory``, one per process of the run that saved it: HEAD format for recipe 2026-07, G0-era format for
    2025-12."""
    fmt = "g0" if saved.recipe == "2025-12" else "head"
    objects = nanochat_files(model, saved.whole_state(), saved.world_size, fmt, dtypes, saved.groups)
    paths = []
    for r, obj in enumerate(objects):
        paths.append(directory / f"optim_{step:06d}_rank{r}.pt")
        torch.save(obj, paths[-1])
    return paths
