"""Hugging Face model folders: reading ours or transformers' built-in NanoChat (``read_hf_model``, where both
exports start), and the export to the built-in NanoChat (``model_type "nanochat"``), which loads with no custom code.

What differs between the two implementations, and how the export keeps outputs equal:
- Names: ``transformer.wte`` -> ``model.embed_tokens``, ``attn.c_q/c_k/c_v/c_proj`` -> ``self_attn.q/k/v/o_proj``,
  ``mlp.c_fc/c_proj`` -> ``mlp.fc1/fc2``; ``lm_head`` unchanged. No tensor needs permuting: transformers' NanoChat
  uses nanochat's rotary convention (its ``rotate_half`` is ``cat(x2, -x1)``, i.e. rotation by -theta on halves).
- RMSNorm: both are parameter-free. ``F.rms_norm`` with the default eps computes in float32 with
  ``torch.finfo(torch.float32).eps`` (also for bf16 inputs, checked on torch 2.x), and transformers' NanoChatRMSNorm
  also computes in float32 with a fixed eps, so ``rms_norm_eps = torch.finfo(torch.float32).eps`` (1.19e-7) matches
  exactly; transformers' default 1e-6 would not.
- Rotary tables: transformers' NanoChat computes cos/sin in float32 and casts them to the activation dtype. It
  therefore equals our model with ``rotary_dtype="float32"``; with nanochat's bf16-rounded tables (our default) the
  native model differs by the table rounding (about 1e-3 relative), which no native setting can express.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import NanoChatConfig

from ..atomic import staged_dir
from ..errors import UserError, one_line
from ..jsonfile import read_json
from ..model import NanoChatGPTConfig
from .files import check_output, check_positive_ints, check_state_dict, files_in
from .generations import generation_of, hf_names, nanochat_shapes

NATIVE_RMS_NORM_EPS = torch.finfo(torch.float32).eps
# (nanochat name, native name); {i} is the layer index
_NAME_MAP = [
    ("transformer.wte.weight", "model.embed_tokens.weight"),
    ("transformer.h.{i}.attn.c_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("transformer.h.{i}.attn.c_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("transformer.h.{i}.attn.c_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("transformer.h.{i}.attn.c_proj.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("transformer.h.{i}.mlp.c_fc.weight", "model.layers.{i}.mlp.fc1.weight"),
    ("transformer.h.{i}.mlp.c_proj.weight", "model.layers.{i}.mlp.fc2.weight"),
    ("lm_head.weight", "lm_head.weight"),
]
_PADDED = ("transformer.wte.weight", "lm_head.weight")
# files of a model directory that carry over unchanged (tokenizer, chat template, generation settings)
CARRIED_FILES = re.compile(
    r"tokenizer.*|special_tokens_map\.json|added_tokens\.json|chat_template\.(jinja|json)|"
    r"generation_config\.json"
)


def _rename(state_dict: dict[str, torch.Tensor], pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    rules = [(re.compile(re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)")), dst) for src, dst in pairs]
    out = {}
    for key, tensor in state_dict.items():
        match = next(((m, dst) for rule, dst in rules if (m := rule.fullmatch(key))), None)
        # unknown names are kept as they are, for the shape check to report
        out[match[1].format(**match[0].groupdict()) if match else key] = tensor
    return out


def nanochat_to_native_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _rename(state_dict, _NAME_MAP)


def native_to_nanochat_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _rename(state_dict, [(native, ours) for ours, native in _NAME_MAP])


def native_config(config: NanoChatGPTConfig):
    """transformers' NanoChatConfig with the same architecture and the eps that keeps outputs equal."""
    return NanoChatConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=4 * config.n_embd,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head,
        max_position_embeddings=config.sequence_len,
        hidden_act="relu2",
        rms_norm_eps=NATIVE_RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        final_logit_softcapping=config.final_logit_softcapping,
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        architectures=["NanoChatForCausalLM"],
        dtype=config.dtype,
    )


def config_from_native(raw: dict) -> NanoChatGPTConfig:
    """Our config from a native NanoChat config.json (rotary tables in float32, as the native model computes them)."""
    if raw.get("intermediate_size", 4 * raw.get("hidden_size", 0)) != 4 * raw.get("hidden_size", 0):
        raise UserError(f"intermediate_size {raw.get('intermediate_size')} is not 4 * hidden_size")
    rope = raw.get("rope_parameters") or {}
    return NanoChatGPTConfig(
        vocab_size=raw["vocab_size"],
        n_embd=raw["hidden_size"],
        n_layer=raw["num_hidden_layers"],
        n_head=raw["num_attention_heads"],
        n_kv_head=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        sequence_len=raw.get("max_position_embeddings", 2048),
        rope_theta=rope.get("rope_theta", 10000.0),
        final_logit_softcapping=raw.get("final_logit_softcapping") or 15.0,
        rotary_dtype="float32",
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        dtype=raw.get("dtype"),
    )


def read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face directory (model.safetensors, or shards listed in the index)."""
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index}: no 'weight_map' object")
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(f"{single}: no such file (nor {index.name})")
    state_dict = {}
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (listed in {index.name})")
        try:
            state_dict.update(load_file(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{path}: cannot be read as safetensors ({e})") from None
    return state_dict


def read_hf_model(model_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], NanoChatGPTConfig]:
    """(state dict under nanochat's names, config) of a directory holding our model or transformers' native
    NanoChat."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: model directory not found")
    config_path = model_dir / "config.json"
    raw = read_json(config_path)
    model_type = raw.get("model_type")
    if model_type == NanoChatGPTConfig.model_type:
        check_positive_ints(
            raw, ("sequence_len", "vocab_size", "n_layer", "n_head", "n_embd"), ("n_kv_head",), str(config_path)
        )
    elif model_type == "nanochat":
        check_positive_ints(
            raw,
            ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
            ("num_key_value_heads", "max_position_embeddings", "intermediate_size"),
            str(config_path),
        )
    try:
        if model_type == NanoChatGPTConfig.model_type:
            config = NanoChatGPTConfig.from_dict(
                {k: v for k, v in raw.items() if k not in ("auto_map", "architectures", "transformers_version")}
            )
        elif model_type == "nanochat":
            config = config_from_native(raw)
        else:
            raise UserError(f"model_type is {model_type!r}, expected 'nanochat_gpt' (or transformers' 'nanochat')")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise UserError(f"{config_path}: {one_line(e)}") from None
    state_dict = read_hf_weights(model_dir)
    if model_type == "nanochat":
        state_dict = native_to_nanochat_names(state_dict)
    else:
        names = {ours: theirs for theirs, ours in hf_names(config).items()}
        state_dict = {names.get(k, k): v for k, v in state_dict.items()}
    check_state_dict(state_dict, nanochat_shapes(config), model_dir / "model.safetensors", config_path)
    return state_dict, config


def check_native_exportable(config: NanoChatGPTConfig, config_path: Path) -> None:
    """One-line UserError unless `config` is nanochat's December 2025 model (G0), the one transformers' NanoChat
    implements; it names what the native class lacks."""
    generation = generation_of(config, config_path)
    if generation.name == "G0":
        return
    lacks = [
        what
        for present, what in (
            (config.residual_lambdas, "per-layer resid/x0 lambdas"),
            ("sliding_attention" in config.layer_types, "sliding-window layers"),
            (config.value_embeddings, "value embeddings with their gates"),
            (config.qk_scale != 1.0, "a q/k scale"),
            (config.smear, "smear"),
            (config.backout, "backout"),
        )
        if present
    ]
    raise UserError(
        f"{config_path}: a nanochat {generation.name} model: transformers' NanoChatForCausalLM has no "
        f"{', '.join(lacks)}, so only December 2025 (G0) models export to it; this one loads with "
        "trust_remote_code=True"
    )


def to_native(model_dir: str | os.PathLike, output_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Export our model directory to transformers' NanoChatForCausalLM (no custom code needed to load it).

    `output_dir` must be new or empty and apart from the source; `overwrite` lets it replace the files it writes
    (other files are kept; the source's files are never replaced)."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    check_output(output_dir, [model_dir], overwrite)
    state_dict, config = read_hf_model(model_dir)
    check_native_exportable(config, model_dir / "config.json")
    native = native_config(config)
    # rows nanochat pads the vocabulary with (bc51da8) are never looked up and their logits are cropped: drop them
    state_dict = {k: v[: config.vocab_size] if k in _PADDED else v for k, v in state_dict.items()}
    with staged_dir(output_dir, overwrite, protect=files_in(model_dir)) as tmp:
        save_file(
            {k: v.contiguous() for k, v in nanochat_to_native_names(state_dict).items()},
            tmp / "model.safetensors",
            metadata={"format": "pt"},
        )
        native.save_pretrained(tmp)
        for path in model_dir.iterdir():
            if path.is_file() and CARRIED_FILES.fullmatch(path.name):
                shutil.copyfile(path, tmp / path.name)  # not copy2: the mode comes from the umask
    return output_dir
