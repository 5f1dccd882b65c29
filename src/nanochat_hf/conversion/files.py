"""File helpers shared by the converters: reading checkpoints with clear errors, atomic directory writes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def expected_shapes(config: NanoChatGPTConfig) -> dict[str, tuple[int, ...]]:
    """State-dict keys and shapes of our model for this config (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = NanoChatGPTForCausalLM(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_state_dict(state_dict: dict[str, torch.Tensor], config: NanoChatGPTConfig, weights: Path,
                     config_source: Path) -> None:
    """Raise a one-line ValueError naming `weights` if keys or shapes do not fit the config from `config_source`."""
    expected = expected_shapes(config)
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing:
        raise ValueError(f"{weights}: missing {len(missing)} tensor(s) the config needs, e.g. {missing[0]!r}")
    if unexpected:
        raise ValueError(f"{weights}: {len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]!r}")
    for key, shape in expected.items():
        got = tuple(state_dict[key].shape)
        if got != shape:
            raise ValueError(f"{weights}: {key} has shape {got} but {config_source.name} implies {shape}")
        if not state_dict[key].is_floating_point():
            raise ValueError(f"{weights}: {key} has dtype {state_dict[key].dtype}, expected a floating point tensor")


def common_dtype(state_dict: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype shared by every tensor, or float32 when they differ (nanochat keeps wte in bf16 on CUDA)."""
    dtypes = {t.dtype for t in state_dict.values()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    allowed = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
               "float16": torch.float16, "fp16": torch.float16}
    if dtype not in allowed:
        raise ValueError(f"dtype must be one of {sorted(allowed)}, got {dtype!r}")
    return allowed[dtype]


@contextmanager
def staging_dir(output_dir: Path) -> Iterator[Path]:
    """Yield an empty temp dir beside `output_dir`; removed on error, so a failed write leaves nothing behind."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"{output_dir}: exists and is not a directory")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=f".{output_dir.name}.tmp-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit_dir(tmp: Path, output_dir: Path) -> Path:
    """Make `tmp` become `output_dir` (an existing one is replaced only after the new one is complete)."""
    output_dir = Path(output_dir)
    if not output_dir.exists():
        os.replace(tmp, output_dir)
        return output_dir
    old = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=f".{output_dir.name}.old-"))
    os.replace(output_dir, old / "dir")
    os.replace(tmp, output_dir)
    shutil.rmtree(old, ignore_errors=True)
    return output_dir


def merge_into_dir(tmp: Path, output_dir: Path) -> Path:
    """Move the files of `tmp` into `output_dir` (kept, e.g. a nanochat checkpoint folder with other steps)."""
    output_dir = Path(output_dir)
    if not output_dir.exists():
        os.replace(tmp, output_dir)
        return output_dir
    for src in sorted(tmp.rglob("*")):
        dst = output_dir / src.relative_to(tmp)
        if src.is_dir():
            dst.mkdir(exist_ok=True)
        else:
            os.replace(src, dst)
    return output_dir
