"""Check a `checkpoint-<step>` folder before resuming from it, pick the newest intact one, and compare run fingerprints.

A checkpoint is trusted only after every file it needs is present and parses: safetensors headers are opened with
`safe_open` (which refuses a file whose size does not match its header, i.e. a truncated one) without loading the
tensors, JSON files are parsed. Bytes flipped inside tensor data cannot be seen this way (safetensors has no checksum).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from safetensors import safe_open

from ...errors import UserError, one_line
from ...jsonfile import read_json, write_json
from .layout import (
    CHECKPOINT_RE,
    FINGERPRINT_FILE,
    MODEL_FILE,
    MODEL_INDEX,
    PER_PROCESS_FILES,
    PER_SHARD_FILES,
    SHARED_FILES,
    STATE_FILE,
)

AUTO_RESUME = ("true", "last", "latest")  # --resume_from_checkpoint values meaning "the newest intact checkpoint"

# Changing these on resume is allowed: the caller applies the new value and prints the notice.
LR_FIELDS = ("matrix_lr", "embedding_lr", "unembedding_lr", "init_lr_frac")
# ... and this one: the optimizer state is read by any number of processes, the data keeps its shards (data/shards.py)
WORLD_SIZE_FIELD = "world_size"
# Fields copied from the arguments: what fixes the data stream, then the optimizer setup.
FINGERPRINT_ARGS = (
    "seed",
    "max_seq_len",
    "device_batch_size",
    "total_batch_size",
    "num_iterations",
    "packing",
    "completion_only_loss",
    *LR_FIELDS,
    "warmdown_ratio",
    "weight_decay",
    "max_grad_norm",
    "optimizer_recipe",
)
# Recorded beside the fields above: the model, the rendering and the code. A different code version is accepted
# when everything else matches.
CODE_VERSION_FIELD, MODEL_CONFIG_FIELD, DATA_FORMAT_FIELD = "code_version", "model_config", "data_format"
# Every field of a run fingerprint, in the order `run_fingerprint` writes them.
FINGERPRINT_FIELDS = (
    *FINGERPRINT_ARGS,
    "world_size",
    "train_mixture",
    "val_mixture",
    "train_dataset",
    "val_dataset",
    MODEL_CONFIG_FIELD,
    DATA_FORMAT_FIELD,
    CODE_VERSION_FIELD,
)
# Config parameters that do not change the computation.
# dtype: the precision the weights were loaded in (a torch.dtype with torch 2.14), not the architecture
_NOT_ARCHITECTURE = {"self", "kwargs", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "dtype"}
# Rendered to token ids for the data format: plain turns, a system message, a tool call and its output.
_PROBE_CONVERSATIONS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there!"},
            {"role": "assistant", "content": "Hello. 2+2=4"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "How many r in strawberry?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me count: "},
                    {"type": "python", "text": "'strawberry'.count('r')"},
                    {"type": "python_output", "text": "3"},
                    {"type": "text", "text": "#### 3"},
                ],
            },
            {"role": "user", "content": "Thanks"},
            {"role": "assistant", "content": "You're welcome."},
        ]
    },
]


def code_version() -> str:
    try:
        return f"nanochat-hf {version('nanochat-hf')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "nanochat-hf (not installed)"


def model_config_fields(config: Any) -> dict[str, Any]:
    """The model's architecture as its config class defines it (JSON values), for the run fingerprint."""
    names = [n for n in inspect.signature(type(config).__init__).parameters if n not in _NOT_ARCHITECTURE]
    return json.loads(json.dumps({n: getattr(config, n, None) for n in names}))


def data_format(tokenizer: Any) -> str:
    """A hash of the token ids this tokenizer and renderer give for fixed probe conversations."""
    from ...tokenizer import render_conversations

    ids, masks = render_conversations(tokenizer, _PROBE_CONVERSATIONS, max_tokens=2048)
    return "sha256:" + hashlib.sha256(json.dumps([ids, masks]).encode()).hexdigest()


def _check_safetensors(path: Path) -> None:
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                f.get_slice(key).get_shape()  # header only; safe_open already checked the data ranges fit the file
    except Exception as e:  # safetensors raises its own error type for every malformed file
        raise UserError(f"{path}: not a readable safetensors file ({one_line(e)})") from None


def verify_checkpoint(path: str | Path) -> None:
    """Raise UserError (one line naming the file) unless `path` is a complete checkpoint: every file of each of the
    processes that wrote it and of each data shard (numbers in nanochat_state.json; any number of processes may
    resume it)."""
    ckpt = Path(path)
    if not ckpt.is_dir():
        raise UserError(f"{ckpt}: checkpoint folder not found")
    if not (ckpt / STATE_FILE).is_file():
        raise UserError(f"{ckpt / STATE_FILE}: missing (the checkpoint is incomplete)")
    state = read_run_state(ckpt)
    required = [
        *SHARED_FILES,
        *(f.format(rank=r) for f in PER_PROCESS_FILES for r in range(state["world_size"])),
        *(f.format(rank=s) for f in PER_SHARD_FILES for s in range(state["data_shards"])),
    ]
    if (ckpt / MODEL_INDEX).is_file():
        index = read_json(ckpt / MODEL_INDEX, expect_object=False)
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            raise UserError(f"{ckpt / MODEL_INDEX}: expected a JSON object with a 'weight_map'")
        required += sorted(set(index["weight_map"].values()))
    else:
        required.append(MODEL_FILE)
    for name in required:
        if not (ckpt / name).is_file():
            raise UserError(f"{ckpt / name}: missing (the checkpoint is incomplete)")
    # Every safetensors/JSON file present is parsed, the optional ones (tokenizer, generation config) too.
    for file in sorted(ckpt.iterdir()):
        if file.suffix == ".safetensors":
            _check_safetensors(file)
        elif file.suffix == ".json":
            read_json(file, expect_object=False)
    load_fingerprint(ckpt)


def read_run_state(ckpt: Path) -> dict:
    """The checkpoint's nanochat state: the logger's, the best val bpb, ``world_size`` (the processes that wrote it)
    and ``data_shards`` (the processes of the run's start, whose data streams it keeps; = world_size if absent)."""
    saved = read_json(ckpt / STATE_FILE)
    if "world_size" not in saved:
        raise UserError(
            f"{ckpt / STATE_FILE}: no 'world_size' field (the file is damaged or was not written by nanochat-hf)"
        )
    saved.setdefault("data_shards", saved["world_size"])
    return saved


def resolve_resume_checkpoint(
    output_dir: str | Path, resume_from_checkpoint: str | bool | None
) -> tuple[Path | None, list[str]]:
    """Map `--resume_from_checkpoint` to a verified checkpoint folder and messages for the user.

    None/False/"" -> (None, []). True/"true"/"last"/"latest" -> the newest intact `checkpoint-<step>` in output_dir
    (by step), with one message per newer checkpoint skipped and why;
    UserError if there is none. Any other string is a path: verified, UserError in one line if it is not usable.
    """
    if resume_from_checkpoint in (None, False, ""):
        return None, []
    if resume_from_checkpoint is True or str(resume_from_checkpoint).lower() in AUTO_RESUME:
        return _newest_intact(Path(output_dir))
    path = Path(resume_from_checkpoint)
    verify_checkpoint(path)
    return path, []


def _newest_intact(output_dir: Path) -> tuple[Path, list[str]]:
    entries = list(output_dir.iterdir()) if output_dir.is_dir() else []
    messages = []
    steps = sorted(
        ((int(m.group(1)), p) for p in entries if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()), reverse=True
    )
    for _, path in steps:
        try:
            verify_checkpoint(path)
        except ValueError as e:
            messages.append(f"skipping {path.name}: {e}")
            continue
        return path, messages
    raise UserError(
        f"--resume_from_checkpoint: no intact checkpoint-<step> folder in {output_dir} to resume from"
        + ("; " + "; ".join(messages) if messages else "")
    )


# ---- run fingerprint (what must not change when resuming) ---------------------------------------------------------


def _file_sha256(path: str | None) -> str | None:
    if path is None or not os.path.isfile(path):
        return path  # None (built-in demo mixture) or a name resolved elsewhere; compared as given
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def run_fingerprint(
    args: Any,
    train_dataset_fingerprint: str | None,
    val_dataset_fingerprint: str | None,
    world_size: int,
    model_config: dict[str, Any],
    data_format: str,
) -> dict[str, Any]:
    """Everything that fixes the data stream and the optimizer setup, as a JSON-able dict.

    The datasets' fingerprints (`Dataset._fingerprint`) cover the data the mixtures resolved to; the mixture files'
    content hashes cover the mixture definitions themselves; `model_config` (`model_config_fields`) and
    `data_format` (`data_format`) the model and the rendering; the code version the release that wrote it.
    """
    fp = {name: getattr(args, name) for name in FINGERPRINT_ARGS}
    fp.update(
        world_size=world_size,
        train_mixture=_file_sha256(args.train_mixture),
        val_mixture=_file_sha256(args.val_mixture),
        train_dataset=train_dataset_fingerprint,
        val_dataset=val_dataset_fingerprint,
    )
    fp.update({MODEL_CONFIG_FIELD: model_config, DATA_FORMAT_FIELD: data_format, CODE_VERSION_FIELD: code_version()})
    return fp


def save_fingerprint(directory: str | Path, fingerprint: dict[str, Any]) -> None:
    write_json(Path(directory) / FINGERPRINT_FILE, fingerprint)


def load_fingerprint(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's saved fingerprint; UserError (one line naming the file and the field) if a field is missing."""
    path = Path(directory) / FINGERPRINT_FILE
    saved = read_json(path)
    missing = [name for name in FINGERPRINT_FIELDS if name not in saved]
    if missing:
        raise UserError(f"{path}: no {missing[0]!r} field (the file is damaged or was not written by nanochat-hf)")
    return saved


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], resume_step: int) -> list[str]:
    """Raise UserError naming the first field that differs (with both values); LR fields may change: notices.
    A checkpoint of another code version whose every field matches is continued, and said."""
    notices = []
    for name, value in current.items():
        if name == CODE_VERSION_FIELD:
            continue
        if name == MODEL_CONFIG_FIELD and saved[name] != value and isinstance(saved[name], dict):
            key = next(k for k in [*value, *saved[name]] if saved[name].get(k) != value.get(k))  # config order
            raise UserError(
                f"cannot resume: the model config differs: {key} was {saved[name].get(key)!r} in the checkpoint and "
                f"is {value.get(key)!r} now (use the checkpoint's model settings, or start a new run in another "
                "--output_dir)"
            )
        elif saved[name] != value and name in LR_FIELDS:
            notices.append(f"{name} changed {saved[name]} -> {value}: applied from step {resume_step}")
        elif saved[name] != value and name == WORLD_SIZE_FIELD:
            notices.append(
                f"resuming a run of {saved[name]} processes on {value}: the optimizer state is re-sharded, the data "
                "keeps its shards (the same micro-batches, docs/distributed.md)"
            )
        elif saved[name] != value:
            what = (
                "the chat rendering or tokenizer changed the token ids"
                if name == DATA_FORMAT_FIELD
                else "it changes the data stream or the optimizer setup mid-run"
            )
            raise UserError(
                f"cannot resume: {name} was {saved[name]!r} in the checkpoint and is {value!r} now; {what} (use the "
                "old value, or start a new run in another --output_dir)"
            )
    if saved[CODE_VERSION_FIELD] != current[CODE_VERSION_FIELD]:
        notices.append(
            f"the checkpoint was written by {saved[CODE_VERSION_FIELD]}, this is {current[CODE_VERSION_FIELD]}: "
            "model config, data format and run setup match, continuing"
        )
    return notices
