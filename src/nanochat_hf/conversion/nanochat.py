"""nanochat checkpoints (model_<step>.pt + meta_<step>.json) <-> Hugging Face directories of our model."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from ..atomic import staged_dir, write_text
from ..errors import UserError, one_line
from ..integration.optimizer_state import read_optimizer_checkpoint
from ..jsonfile import read_json
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from ..paths import nanochat_base_dir
from ..tokenizer import BOS_TOKEN, EOS_TOKEN, load_nanochat_tokenizer, save_nanochat_tokenizer, token_bytes
from .files import (
    check_output,
    check_state_dict,
    common_dtype,
    files_in,
    parse_dtype,
)
from .generations import (
    BY_NAME,
    detect,
    generation_of,
    hf_names,
    meta_model_config,
    model_config_of,
    nanochat_dtype,
    nanochat_shapes,
    window_pattern_of,
)
from .native import read_hf_model
from .optimizer_files import write_nanochat_optimizer

# nanochat's load_model(source): base_train, chat_sft and chat_rl write these folders in every generation; mid_train
# wrote mid_checkpoints until mid-training went (1ddaad1, 2026-01-31; the loader forgot the name at 72b9064): G0-G2
# and early G3 models. HEAD's chat_eval -i sft, chat_cli and chat_rl read an SFT result from chatsft_checkpoints.
SOURCE_FOLDERS = {
    "base": "base_checkpoints",
    "mid": "mid_checkpoints",
    "sft": "chatsft_checkpoints",
    "rl": "chatrl_checkpoints",
}
NO_MID = ("G4", "G5")  # generations whose nanochat has no mid_checkpoints (6ed7d1d on)
NANOCHAT_META_FILE = "nanochat_meta.json"  # the source meta, kept beside a converted model (step, user_config...)
# The meta keys nanochat HEAD's chat_sft.py writes with a fine-tuned model (its save_checkpoint call), in its order
FINETUNED_META_KEYS = ("step", "val_bpb", "model_config", "user_config")


def finetuned_meta(source_meta: dict, step: int, val_bpb: float | None, user_config: dict) -> dict:
    """The meta of a model fine-tuned from a nanochat checkpoint whose meta is `source_meta`, as chat_sft.py writes
    it (`FINETUNED_META_KEYS`): this run's step, val bpb (None: not measured) and arguments, and the source's
    model_config (its window_pattern; to_nanochat writes the model's own). Not base_train's keys for resuming the
    base run (dataloader_state_dict, loop_state, its batch sizes): they describe that run, not this model. A model
    fine-tuned here keeps it in NANOCHAT_META_FILE, from where to_nanochat writes it out, as it writes an RL
    result's (which has none: step and model_config)."""
    values = (step, val_bpb, source_meta.get("model_config", {}), user_config)
    return dict(zip(FINETUNED_META_KEYS, values))


_MODEL_FILE = re.compile(r"model_(\d+)\.pt")


# ---------------------------------------------------------------- locating and reading nanochat checkpoints


def available_steps(checkpoint_dir: str | os.PathLike) -> list[int]:
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"{checkpoint_dir}: checkpoint directory not found")
    return sorted(int(m.group(1)) for p in checkpoint_dir.iterdir() if (m := _MODEL_FILE.fullmatch(p.name)))


def find_nanochat_checkpoint(
    base_dir: str | os.PathLike | None = None,
    source: str = "base",
    model_tag: str | None = None,
    step: int | None = None,
) -> tuple[Path, int]:
    """(checkpoint_dir, step) in nanochat's layout: ``<base>/<source>_checkpoints/<tag>/model_<step:06d>.pt``.

    Defaults as nanochat: base ``$NANOCHAT_BASE_DIR`` or ``~/.cache/nanochat``, the largest ``d<N>`` model tag
    (else the most recently modified), the latest step. The tokenizer lives in ``<base>/tokenizer``.
    """
    if source not in SOURCE_FOLDERS:
        raise UserError(f"source must be one of {sorted(SOURCE_FOLDERS)}, got {source!r}")
    root = Path(base_dir) if base_dir is not None else nanochat_base_dir()
    folder = root / SOURCE_FOLDERS[source]
    if model_tag is None:
        tags = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
        if not tags:
            raise FileNotFoundError(f"{folder}: no model tag folders (expected e.g. {folder / 'd20'})")
        depth = {p: int(m.group(1)) for p in tags if (m := re.fullmatch(r"d(\d+)", p.name))}
        checkpoint_dir = max(depth, key=depth.get) if depth else max(tags, key=lambda p: p.stat().st_mtime)
    else:
        checkpoint_dir = folder / model_tag
    steps = available_steps(checkpoint_dir)
    if not steps:
        raise FileNotFoundError(f"{checkpoint_dir}: no model_<step>.pt checkpoint in this directory")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"{checkpoint_dir / f'model_{step:06d}.pt'}: no such file (steps available: {steps})")
    return checkpoint_dir, steps[-1] if step is None else step


def nanochat_tokenizer_dir(checkpoint_dir: str | os.PathLike) -> Path:
    """Where nanochat keeps the tokenizer of a checkpoint folder ``<base>/<source>_checkpoints/<tag>``:
    ``<base>/tokenizer`` (``$NANOCHAT_BASE_DIR/tokenizer``)."""
    return Path(checkpoint_dir).resolve().parent.parent / "tokenizer"


def read_nanochat_checkpoint(
    checkpoint_dir: str | os.PathLike, step: int | None = None
) -> tuple[dict[str, torch.Tensor], NanoChatGPTConfig, dict, int]:
    """(state_dict without ``_orig_mod.``, config, meta, step), validated: the keys are those of one nanochat
    generation (G0-G5), and fit meta's config; tensors keep their stored dtypes."""
    checkpoint_dir = Path(checkpoint_dir)
    steps = available_steps(checkpoint_dir)
    if not steps:
        raise FileNotFoundError(f"{checkpoint_dir}: no model_<step>.pt checkpoint in this directory")
    step = steps[-1] if step is None else int(step)
    model_path = checkpoint_dir / f"model_{step:06d}.pt"
    if step not in steps:
        raise FileNotFoundError(f"{model_path}: no such file (steps available: {steps})")
    meta_path = checkpoint_dir / f"meta_{step:06d}.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no such file (nanochat writes it beside {model_path.name})")
    meta = read_json(meta_path)
    model_config = model_config_of(meta, meta_path)
    try:
        state_dict = torch.load(model_path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any failure here means a corrupt or foreign file
        raise UserError(
            f"{model_path}: cannot be read by torch.load(weights_only=True) ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise UserError(f"{model_path}: expected a state dict of tensors, got {type(state_dict).__name__}")
    state_dict = {k.removeprefix("_orig_mod."): v for k, v in state_dict.items()}
    config = detect(state_dict, model_config, model_path, meta_path)
    check_state_dict(state_dict, nanochat_shapes(config), model_path, meta_path)
    return state_dict, config, meta, step


def _load_tokenizer(tokenizer_dir: str | os.PathLike, config: NanoChatGPTConfig, trust_pickle: bool):
    tokenizer = load_nanochat_tokenizer(tokenizer_dir, trust_pickle=trust_pickle)
    if len(tokenizer) != config.vocab_size:
        raise UserError(
            f"{Path(tokenizer_dir) / 'tokenizer.pkl'}: tokenizer has {len(tokenizer)} tokens but the "
            f"model's vocab_size is {config.vocab_size}"
        )
    tokenizer.model_max_length = config.sequence_len  # saved beside the model: its context length
    return tokenizer


def _set_special_ids(config: NanoChatGPTConfig, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """bos = <|bos|>, eos = <|assistant_end|> (where a chat turn ends), pad = the tokenizer's pad."""
    config.bos_token_id = tokenizer.convert_tokens_to_ids(BOS_TOKEN)
    config.eos_token_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.bos_token_id
    return GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )


# ---------------------------------------------------------------- nanochat -> Hugging Face


def load_from_nanochat(
    checkpoint_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    step: int | None = None,
    trust_pickle: bool = False,
    dtype: str | torch.dtype | None = torch.float32,
) -> tuple[NanoChatGPTForCausalLM, PreTrainedTokenizerBase]:
    """A nanochat checkpoint as an in-memory (model, tokenizer); weights cast to `dtype` (None: as stored, or
    float32 when mixed)."""
    state_dict, config, _, _ = read_nanochat_checkpoint(checkpoint_dir, step)
    tokenizer = _load_tokenizer(tokenizer_dir, config, trust_pickle)
    generation_config = _set_special_ids(config, tokenizer)
    dtype = parse_dtype(dtype) or common_dtype(state_dict)
    with torch.device("meta"):
        model = NanoChatGPTForCausalLM(config)
    names = hf_names(config)
    model.load_state_dict({names[k]: v.to(dtype) for k, v in state_dict.items()}, strict=True, assign=True)
    model.generation_config = generation_config
    return model.eval(), tokenizer  # eval mode, as from_pretrained returns it


def from_nanochat(
    checkpoint_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    step: int | None = None,
    dtype: str | torch.dtype | None = None,
    trust_pickle: bool = False,
    overwrite: bool = False,
) -> Path:
    """Convert a nanochat checkpoint + tokenizer to a Hugging Face directory (safetensors, config with auto_map and
    code files, tokenizer with chat template, generation config). `dtype` None keeps the stored dtypes.

    `output_dir` must be new or empty and apart from the sources; `overwrite` lets it replace the files it writes
    in any directory (other files are kept; the source files are never replaced)."""
    output_dir, sources = Path(output_dir), [Path(checkpoint_dir), Path(tokenizer_dir)]
    check_output(output_dir, sources, overwrite)
    state_dict, config, meta, step = read_nanochat_checkpoint(checkpoint_dir, step)
    tokenizer = _load_tokenizer(tokenizer_dir, config, trust_pickle)
    generation_config = _set_special_ids(config, tokenizer)
    if (dtype := parse_dtype(dtype)) is not None:
        state_dict = {k: v.to(dtype) for k, v in state_dict.items()}
    names = hf_names(config)
    state_dict = {names[k]: v.contiguous() for k, v in state_dict.items()}
    with torch.device("meta"):  # only for save_pretrained's config + code files; weights come from state_dict
        model = NanoChatGPTForCausalLM(config).to(common_dtype(state_dict))
    model.generation_config = generation_config
    with staged_dir(output_dir, overwrite, protect=files_in(*sources)) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        write_text(tmp / NANOCHAT_META_FILE, json.dumps({**meta, "step": step}, indent=2))
    return output_dir


# ---------------------------------------------------------------- Hugging Face -> nanochat


def _default_step(model_dir: Path) -> int:
    """The step to name a nanochat checkpoint after: the Trainer's global_step, else the source nanochat step."""
    for name, key in (("trainer_state.json", "global_step"), (NANOCHAT_META_FILE, "step")):
        path = model_dir / name
        if path.is_file() and isinstance(step := read_json(path).get(key), int):
            return step
    return 0


def to_nanochat(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    step: int | None = None,
    tokenizer_output_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model_<step:06d>.pt`` + ``meta_<step:06d>.json`` into `output_dir` (other files there are kept), and
    the tokenizer as nanochat's ``tokenizer.pkl`` + ``token_bytes.pt`` into `tokenizer_output_dir` (default: where
    nanochat reads it, ``<base>/tokenizer`` for an `output_dir` ``<base>/<source>_checkpoints/<tag>``).

    The checkpoint is the one nanochat writes for the model's generation (G0-G5): the same tensor names and order,
    wte/value embeddings bf16 when stored so (else fp32), everything else fp32, and the meta's ``model_config``
    with ``window_pattern`` from G2 on (the source meta's pattern when it builds the same layers); the other meta
    fields (val_bpb, user_config...) come from the source meta kept beside a converted model or a model trained from
    a nanochat checkpoint (with that training's val bpb), the step from trainer_state.json. from_nanochat ->
    to_nanochat is bit-identical.

    Existing files of those names are replaced only with `overwrite`, and the source's files never."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    has_tokenizer = (model_dir / "tokenizer.json").is_file()
    if has_tokenizer and tokenizer_output_dir is None and not output_dir.resolve().parent.name.endswith("_checkpoints"):
        raise UserError(
            f"{output_dir}: --output is not a nanochat checkpoint folder <base>/<source>_checkpoints/<tag>"
            " (nanochat reads the tokenizer from <base>/tokenizer): write there, or pass "
            "--tokenizer-output DIR"
        )
    tokenizer_dir = nanochat_tokenizer_dir(output_dir) if tokenizer_output_dir is None else Path(tokenizer_output_dir)
    check_output(output_dir, [model_dir], overwrite, may_hold_other_files=True)
    check_output(tokenizer_dir, [model_dir], overwrite, may_hold_other_files=True)
    state_dict, config = read_hf_model(model_dir)
    config_path = model_dir / "config.json"
    source_meta = read_json(model_dir / NANOCHAT_META_FILE) if (model_dir / NANOCHAT_META_FILE).is_file() else {}
    source_pattern = (source_meta.get("model_config") or {}).get("window_pattern")
    generation = generation_of(config, config_path)
    if generation.name == "G1" and isinstance(source_pattern, str):
        generation = BY_NAME["G2"]  # the source meta had a window pattern ("L": the same model as G1)
    if generation.name in NO_MID and output_dir.resolve().parent.name == SOURCE_FOLDERS["mid"]:
        raise UserError(
            f"{output_dir}: nanochat of {generation.name} ({generation.commit} on) has no mid_checkpoints "
            f"(mid-training went at 1ddaad1): write a fine-tuned model to <base>/{SOURCE_FOLDERS['sft']}/<tag>, "
            "where chat_eval -i sft, chat_cli and chat_rl read it"
        )
    pattern = window_pattern_of(config, generation, source_pattern, config_path) if generation.windows else None
    step = _default_step(model_dir) if step is None else int(step)
    tokenizer = None
    if has_tokenizer:
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except Exception as e:  # noqa: BLE001 -- tokenizers raises plain Exception on a damaged tokenizer.json
            raise UserError(f"{model_dir / 'tokenizer.json'}: cannot be loaded ({one_line(e)})") from None
        if len(tokenizer) != config.vocab_size:
            raise UserError(
                f"{model_dir / 'tokenizer.json'}: tokenizer has {len(tokenizer)} tokens but the "
                f"model's vocab_size is {config.vocab_size}"
            )
    # The checkpoint names are checked now, before any work; the tokenizer files when they are written (the same
    # tokenizer written again for another step is byte-identical, and left as it is).
    saved = read_optimizer_checkpoint(model_dir)  # a trainer checkpoint: its optimizer as nanochat's optim_*.pt too
    existing = [
        p
        for p in (
            output_dir / f"model_{step:06d}.pt",
            output_dir / f"meta_{step:06d}.json",
            *output_dir.glob(f"optim_{step:06d}_rank*.pt"),
        )
        if p.exists()
    ]
    if existing and not overwrite:
        raise FileExistsError(
            f"{existing[0]}: already exists (pass --overwrite to replace it, or choose another --output / --step)"
        )
    nanochat_state = {k: state_dict[k].to(nanochat_dtype(k, state_dict[k].dtype)) for k in nanochat_shapes(config)}
    meta = {**source_meta, "step": step, "model_config": meta_model_config(config, pattern)}
    protect = files_in(model_dir)
    with staged_dir(output_dir, overwrite, protect) as tmp:
        if saved is not None:
            with torch.device("meta"):
                model = NanoChatGPTForCausalLM(config)
            ours = hf_names(config)  # the optimizer writer knows parameters by our names
            write_nanochat_optimizer(model, saved, tmp, step, {ours[n]: t.dtype for n, t in nanochat_state.items()})
        if tokenizer is not None:  # lands first: a refusal there leaves the checkpoint folder untouched too
            with staged_dir(tokenizer_dir, overwrite, protect) as tok_tmp:
                _write_nanochat_tokenizer(tokenizer, tok_tmp)
        torch.save(nanochat_state, tmp / f"model_{step:06d}.pt")
        write_text(tmp / f"meta_{step:06d}.json", json.dumps(meta, indent=2))
    return output_dir


def _write_nanochat_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    try:
        save_nanochat_tokenizer(tokenizer, directory)
    except ImportError:  # tiktoken is optional: token_bytes.pt (used by nanochat's bpb evaluation) still helps
        warnings.warn("tiktoken is not installed: writing token_bytes.pt only, no tokenizer.pkl", stacklevel=3)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(token_bytes(tokenizer).to(torch.int32), directory / "token_bytes.pt")
