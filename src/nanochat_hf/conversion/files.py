"""File helpers shared by the converters: checking what a checkpoint holds, the --output policy (JSON files:
`nanochat_hf.jsonfile`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError


def check_positive_ints(fields: dict, required: tuple[str, ...], optional: tuple[str, ...], where: str) -> None:
    """One-line UserError naming the first field of `fields` that is missing or not a positive integer."""
    for key in required + optional:
        if key not in fields or (key in optional and fields[key] is None):
            if key in required:
                raise UserError(f"{where}: missing field {key!r} (a positive integer)")
            continue
        value = fields[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{where}: field {key!r} must be a positive integer, got {value!r}")


def check_state_dict(
    state_dict: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], weights: Path, config_source: Path
) -> None:
    """Raise a one-line UserError naming `weights` if its keys or shapes are not `expected` (the tensors of the
    config read from `config_source`)."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing:
        raise UserError(
            f"{weights}: missing {len(missing)} tensor(s) {config_source.name} implies, e.g. {missing[0]!r}"
        )
    if unexpected:
        raise UserError(
            f"{weights}: {len(unexpected)} tensor(s) {config_source.name} does not imply, e.g. {unexpected[0]!r}"
        )
    for key, shape in expected.items():
        got = tuple(state_dict[key].shape)
        if got != shape:
            raise UserError(f"{weights}: {key} has shape {got} but {config_source.name} implies {shape}")
        if not state_dict[key].is_floating_point():
            raise UserError(f"{weights}: {key} has dtype {state_dict[key].dtype}, expected a floating point tensor")


def common_dtype(state_dict: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype shared by every tensor, or float32 when they differ (nanochat keeps wte in bf16 on CUDA)."""
    dtypes = {t.dtype for t in state_dict.values()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    allowed = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in allowed:
        raise UserError(f"dtype must be one of {sorted(allowed)}, got {dtype!r}")
    return allowed[dtype]


def _relation(output: Path, source: Path) -> str | None:
    out, src = output.resolve(), source.resolve()
    if out == src:
        return "is"
    if src in out.parents:
        return "is inside"
    if out in src.parents:
        return "contains"
    return None


def check_output(output: Path, sources: list[Path], overwrite: bool, may_hold_other_files: bool = False) -> None:
    """Refuse, before any work, an --output that is a file, or (unless `overwrite`) one that is, contains or is
    inside a source directory, or that already holds files (`may_hold_other_files`: a nanochat checkpoint folder,
    where other steps live; its own file names are checked when writing)."""
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output}: --output exists and is not a directory")
    if overwrite:
        return
    for source in sources:
        if relation := _relation(output, source):
            raise FileExistsError(
                f"{output}: --output {relation} the source {source}; choose another directory "
                "(or pass --overwrite to add the converted files there; source files are kept)"
            )
    if not may_hold_other_files and output.is_dir() and any(output.iterdir()):
        raise FileExistsError(
            f"{output}: --output is not empty; choose a new directory (or pass --overwrite to "
            "replace the files this command writes; other files are kept)"
        )


def files_in(*directories: Path) -> list[Path]:
    """The files directly in these directories (a converter's sources, which it never replaces)."""
    return [p for d in directories if d.is_dir() for p in d.iterdir() if p.is_file()]
