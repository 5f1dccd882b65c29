"""nanochat's model generations G0 to G5: what their checkpoint files hold, and the config fields that describe them.

One table (``GENERATIONS``) says, for each generation, the first nanochat commit that wrote it, the
``NanoChatGPTConfig`` fields it sets and its short attention window. Everything else here is derived from it:
the tensors nanochat writes for a config (``nanochat_shapes``, in nanochat's state-dict order), the generation of
a checkpoint from its keys and meta (``detect``), the generation of a config (``generation_of``) and the
``model_config`` block of a meta json (``meta_model_config``). Read from nanochat's ``nanochat/gpt.py``,
``checkpoint_manager.py`` and ``scripts/base_train.py`` at each commit named in the table.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import UserError
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from ..model.modeling_nanochat_gpt import SMEAR_CHANNELS
from .files import check_positive_ints

logger = logging.getLogger(__name__)

NANOCHAT_CONFIG_KEYS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
PAD_VOCAB_SIZE_TO = 64  # nanochat pads wte/lm_head/value-embedding rows to a multiple of 64 since bc51da8


@dataclass(frozen=True)
class Generation:
    name: str
    commit: str  # the first nanochat commit that writes such checkpoints
    fields: dict = field(default_factory=dict)  # NanoChatGPTConfig fields that differ from G0's defaults
    short_window: Callable[[int], int] | None = None  # keys before the query of an "S" layer, for sequence_len T

    @property
    def windows(self) -> bool:
        """Whether the meta's ``model_config`` carries ``window_pattern`` (written from fbc1484 on)."""
        return self.short_window is not None


_G1 = {"residual_lambdas": True}
_G3 = {**_G1, "value_embeddings": True, "ve_gate_channels": 32, "ve_gate_scale": 2.0}
# rotary tables: bfloat16 up to nanochat 1076f97 (2026-03-04), then in the compute dtype. G3 ran both ways (85 commits
# before 1076f97, one after, and nothing in a G3 file says which): G3 keeps bfloat16, the G3 of almost all its
# commits; a G3 model trained after 1076f97 gets nanochat's logits with rotary_dtype "compute" set in config.json.
_G4 = {
    **_G3,
    "ve_gate_channels": 12,
    "ve_gate_scale": 3.0,
    "qk_scale": 1.15,
    "rope_theta": 100000.0,
    "rotary_dtype": "compute",
}
_G5 = {**_G4, "qk_scale": 1.2, "smear": True, "backout": True}
GENERATIONS = (
    Generation("G0", "790f3be"),
    Generation("G1", "aa530cd", _G1),
    Generation("G2", "fbc1484", _G1, lambda t: t // 2),
    Generation("G3", "a91743c", _G3, lambda t: t // 2),
    Generation("G4", "6ed7d1d", _G4, lambda t: -(-t // 3 // 128) * 128),  # as nanochat writes it: ceil to 128
    Generation("G5", "a825e63", _G5, lambda t: -(-t // 4 // 128) * 128),
)
BY_NAME = {g.name: g for g in GENERATIONS}
# the fields that tell generations apart (G0's values are the config defaults); ve_gate_* only with value_embeddings
_GENERATION_FIELDS = (
    "residual_lambdas",
    "value_embeddings",
    "ve_gate_channels",
    "ve_gate_scale",
    "qk_scale",
    "rope_theta",
    "smear",
    "backout",
    "final_logit_softcapping",
)

# every tensor name any generation writes ({i}: a layer); anything else is refused
_KNOWN_KEYS = re.compile(
    r"transformer\.wte\.weight|lm_head\.weight|resid_lambdas|x0_lambdas|smear_gate\.weight|"
    r"smear_lambda|backout_lambda|value_embeds\.\d+\.weight|"
    r"transformer\.h\.\d+\.(attn\.(c_q|c_k|c_v|c_proj|ve_gate)|mlp\.(c_fc|c_proj))\.weight"
)
_VE_KEY = re.compile(r"value_embeds\.(\d+)\.weight")
_GATE_KEY = re.compile(r"transformer\.h\.(\d+)\.attn\.ve_gate\.weight")
_SMEAR_KEYS = ("smear_gate.weight", "smear_lambda", "backout_lambda")


def _fields(config: NanoChatGPTConfig) -> dict:
    keys = [k for k in _GENERATION_FIELDS if config.value_embeddings or not k.startswith("ve_gate")]
    return {k: getattr(config, k) for k in keys}


def _generation_fields(generation: Generation) -> dict:
    return _fields(NanoChatGPTConfig(n_layer=1, n_head=1, n_embd=64, **generation.fields))


def nanochat_shapes(config: NanoChatGPTConfig) -> dict[str, tuple[int, ...]]:
    """The tensors nanochat's ``GPT.state_dict()`` holds for this config, in its order (the GPT's own scalars,
    then ``transformer``, ``lm_head``, ``smear_gate``, ``value_embeds``)."""
    d, n_layer, vocab = config.n_embd, config.n_layer, config.padded_vocab_size
    kv = config.n_kv_head * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if config.residual_lambdas:
        shapes.update({"resid_lambdas": (n_layer,), "x0_lambdas": (n_layer,)})
    if config.smear:
        shapes["smear_lambda"] = (1,)
    if config.backout:
        shapes["backout_lambda"] = (1,)
    shapes["transformer.wte.weight"] = (vocab, d)
    ve_layers = config.value_embedding_layers
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        shapes.update(
            {
                p + "attn.c_q.weight": (d, d),
                p + "attn.c_k.weight": (kv, d),
                p + "attn.c_v.weight": (kv, d),
                p + "attn.c_proj.weight": (d, d),
            }
        )
        if i in ve_layers:
            shapes[p + "attn.ve_gate.weight"] = (config.n_kv_head, config.ve_gate_channels)
        shapes.update({p + "mlp.c_fc.weight": (4 * d, d), p + "mlp.c_proj.weight": (d, 4 * d)})
    shapes["lm_head.weight"] = (vocab, d)
    if config.smear:
        shapes["smear_gate.weight"] = (1, SMEAR_CHANNELS)
    shapes.update({f"value_embeds.{i}.weight": (vocab, kv) for i in ve_layers})
    return shapes


def hf_names(config: NanoChatGPTConfig) -> dict[str, str]:
    """nanochat's tensor name -> our model's: the same, or under ``transformer.`` where our model keeps a G1-G5
    parameter that nanochat's GPT holds beside ``transformer`` (resid_lambdas, value_embeds.<i>, smear_gate...)."""
    with torch.device("meta"):
        ours = set(NanoChatGPTForCausalLM(config).state_dict())
    return {
        k: f"transformer.{k}" if k not in ours and f"transformer.{k}" in ours else k for k in nanochat_shapes(config)
    }


def nanochat_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype nanochat stores a tensor in: wte and value embeddings in the compute dtype (bf16 on a recent GPU,
    else fp32), every other parameter fp32 (its master weights)."""
    embedding = key == "transformer.wte.weight" or key.startswith("value_embeds.")
    return torch.bfloat16 if embedding and dtype == torch.bfloat16 else torch.float32


# ------------------------------------------------------------------------------------- sliding windows


def layer_windows(
    generation: Generation, pattern: str, sequence_len: int, n_layer: int
) -> tuple[list[str], int | None]:
    """(layer_types, sliding_window) for nanochat's ``window_pattern``: the pattern tiled over the layers, the last
    layer always "L"; an "S" layer sees its short window plus itself (FlashAttention's ``window_size=(w, 0)``). A
    short window reaching across the whole context (small sequence_len) is full attention there."""
    if generation.short_window is None:
        return ["full_attention"] * n_layer, None
    chars = [pattern.upper()[i % len(pattern)] for i in range(n_layer)]
    chars[-1] = "L"
    short = generation.short_window(sequence_len)
    sliding = short < sequence_len - 1
    types = ["sliding_attention" if c == "S" and sliding else "full_attention" for c in chars]
    return types, short + 1 if "sliding_attention" in types else None


def _check_pattern(pattern: object, where: str) -> str:
    if not isinstance(pattern, str) or not pattern or not set(pattern.upper()) <= {"S", "L"}:
        raise UserError(
            f"{where}: model_config.window_pattern must be a non-empty string of S and L (nanochat's "
            f"short and long windows), got {pattern!r}"
        )
    return pattern


def window_pattern_of(
    config: NanoChatGPTConfig, generation: Generation, preferred: str | None, config_path: Path
) -> str:
    """A ``window_pattern`` under which nanochat's loader builds the layers of `config`: `preferred` (the source
    meta's) when it does, else the shortest that does. One-line UserError when none can (a window nanochat
    would not compute for this sequence_len)."""
    types, window, seq = list(config.layer_types), config.sliding_window, config.sequence_len
    if "sliding_attention" in types:
        short = generation.short_window(seq)
        if window - 1 >= seq:
            raise UserError(
                f"{config_path}: sliding_window {window} is larger than sequence_len {seq}: nanochat's "
                f"short window is {short} keys before the query for this sequence_len"
            )
        if window != short + 1:
            raise UserError(
                f"{config_path}: sliding_window {window} is not nanochat's {generation.name} short window "
                f"for sequence_len {seq} ({short} keys before the query, sliding_window {short + 1})"
            )
        if types[-1] != "full_attention":
            raise UserError(
                f"{config_path}: layer_types ends with 'sliding_attention'; nanochat's last layer "
                f"always attends to the whole context"
            )
    candidates = ([preferred] if preferred else []) + [
        "".join("S" if t == "sliding_attention" else "L" for t in types[:n]) for n in range(1, len(types) + 1)
    ]
    return next(p for p in candidates if layer_windows(generation, p, seq, config.n_layer)[0] == types)


# ------------------------------------------------------------------------------------- nanochat -> config


def _parent_pattern(checkpoint_dir: Path, model_config: dict) -> tuple[str, Path] | None:
    """window_pattern of the base checkpoint a mid/SFT/RL checkpoint was trained from
    (``<base>/base_checkpoints/<same tag>``, the newest meta with the same architecture), if there is one."""
    parent = checkpoint_dir.parent.parent / "base_checkpoints" / checkpoint_dir.name
    if checkpoint_dir.parent.name == "base_checkpoints" or not parent.is_dir():
        return None
    for meta_path in sorted(parent.glob("meta_*.json"), reverse=True):
        try:
            found = json.loads(meta_path.read_text()).get("model_config") or {}
        except (OSError, ValueError, AttributeError):
            continue
        same = all(found.get(k) == model_config[k] for k in NANOCHAT_CONFIG_KEYS if k != "sequence_len")
        if same and isinstance(found.get("window_pattern"), str):
            return _check_pattern(found["window_pattern"], str(meta_path)), meta_path
    return None


def _generation_of_keys(keys: set[str], shapes: dict[str, tuple[int, ...]], model_path: Path) -> Generation:
    unknown = sorted(k for k in keys if not _KNOWN_KEYS.fullmatch(k))
    if unknown:
        hint = (
            " (the bigram/engram experiment of nanochat 59e36cc..74554be, reverted before any release)"
            if any(k.startswith("bigram") for k in unknown)
            else ""
        )
        raise UserError(
            f"{model_path}: tensor(s) of no nanochat model generation G0-G5: {', '.join(unknown[:6])}"
            f"{' ...' if len(unknown) > 6 else ''}{hint}"
        )
    lambdas = [k for k in ("resid_lambdas", "x0_lambdas") if k in keys]
    smear = [k for k in _SMEAR_KEYS if k in keys]
    ve = sorted(k for k in keys if _VE_KEY.fullmatch(k) or _GATE_KEY.fullmatch(k))
    if len(lambdas) == 1:
        other = "x0_lambdas" if lambdas[0] == "resid_lambdas" else "resid_lambdas"
        raise UserError(f"{model_path}: has {lambdas[0]} but not {other} (nanochat writes both from aa530cd on)")
    if smear and len(smear) < len(_SMEAR_KEYS):
        raise UserError(
            f"{model_path}: has {smear[0]} but not {next(k for k in _SMEAR_KEYS if k not in keys)} "
            "(nanochat writes smear_gate, smear_lambda and backout_lambda together from a825e63 on)"
        )
    later = smear[:1] or ve[:1]
    if later and not lambdas:
        raise UserError(
            f"{model_path}: has {later[0]} but no resid_lambdas/x0_lambdas: no nanochat generation has "
            "one without the other"
        )
    if smear and not ve:
        raise UserError(f"{model_path}: has {smear[0]} (G5) but no value_embeds.*: G5 models have value embeddings")
    if not ve:
        return BY_NAME["G1"] if lambdas else BY_NAME["G0"]
    widths = {shapes[k][-1] for k in ve if _GATE_KEY.fullmatch(k) and len(shapes[k]) == 2}
    gate = next((k for k in ve if _GATE_KEY.fullmatch(k)), None)
    if gate is None:
        raise UserError(f"{model_path}: has {ve[0]} but no transformer.h.<i>.attn.ve_gate.weight (G3 on)")
    if widths not in ({32}, {12}):
        raise UserError(
            f"{model_path}: {gate} has shape {tuple(shapes[gate])}: nanochat's ve_gate reads 32 "
            "channels (G3, a91743c) or 12 (G4 6ed7d1d, G5 a825e63)"
        )
    if smear:
        if widths == {32}:
            raise UserError(f"{model_path}: {gate} reads 32 channels (G3) but {smear[0]} is G5's (12 channels)")
        return BY_NAME["G5"]
    return BY_NAME["G3"] if widths == {32} else BY_NAME["G4"]


def model_config_of(meta: dict, meta_path: Path) -> dict:
    """The meta's ``model_config``, checked: nanochat's six positive integers, and no field of no generation."""
    model_config = meta.get("model_config")
    if not isinstance(model_config, dict):
        raise UserError(f"{meta_path}: no 'model_config' object (nanochat's meta JSON has one)")  # noqa: TRY004
    check_positive_ints(model_config, NANOCHAT_CONFIG_KEYS, (), f"{meta_path}: model_config")
    unknown = sorted(set(model_config) - set(NANOCHAT_CONFIG_KEYS) - {"window_pattern"})
    if unknown:
        raise UserError(f"{meta_path}: model_config field(s) of no nanochat generation G0-G5: {', '.join(unknown)}")
    return model_config


def detect(
    state_dict: dict[str, torch.Tensor], model_config: dict, model_path: Path, meta_path: Path
) -> NanoChatGPTConfig:
    """Our config of a nanochat checkpoint (keys without ``_orig_mod.``), from its tensor names
    and meta's `model_config` (checked by ``model_config_of``); the window pattern from the meta, else from the
    parent base checkpoint's meta, else "L" (as nanochat's own loader assumes) with a one-line warning. Raises a
    one-line UserError naming the file and key for a tensor of no generation, a meta that contradicts the keys,
    or a value embedding on the wrong layer."""
    shapes = {k: tuple(v.shape) for k, v in state_dict.items()}
    generation = _generation_of_keys(set(state_dict), shapes, model_path)
    pattern = model_config.get("window_pattern")
    if pattern is not None:
        _check_pattern(pattern, str(meta_path))
        if generation.name == "G0":
            raise UserError(
                f"{meta_path}: model_config.window_pattern is set but {model_path.name} has no "
                "resid_lambdas/x0_lambdas: nanochat writes window_pattern only for models that have "
                "them (fbc1484 on)"
            )
    elif generation.name != "G0":
        found = _parent_pattern(model_path.parent, model_config)
        if found:
            pattern = found[0]
            logger.warning(
                "%s: no model_config.window_pattern; using %r from the parent base checkpoint %s",
                meta_path,
                pattern,
                found[1],
            )
        elif not (generation.name == "G1" and model_path.parent.parent.name == "base_checkpoints"):
            pattern = "L"  # (a G1 base checkpoint without one predates windows: nothing to assume)
            logger.warning(
                "%s: no model_config.window_pattern and no parent base checkpoint meta with one: assumed "
                "'L' (every layer attends to the whole context), as nanochat's own loader does",
                meta_path,
            )
    if generation.name == "G1" and pattern is not None:
        generation = BY_NAME["G2"]  # G1's keys, and a window pattern: G2 (the same model when the pattern is "L")
    seq, n_layer = model_config["sequence_len"], model_config["n_layer"]
    layer_types, sliding_window = layer_windows(generation, pattern or "L", seq, n_layer)
    rows = shapes.get("transformer.wte.weight", (0,))[0]
    vocab = model_config["vocab_size"]
    pad = PAD_VOCAB_SIZE_TO if generation.name != "G0" or rows != vocab else 1  # G0 before bc51da8: unpadded
    try:
        config = NanoChatGPTConfig(
            **{k: model_config[k] for k in NANOCHAT_CONFIG_KEYS},
            **generation.fields,
            pad_vocab_size_to=pad,
            layer_types=layer_types,
            sliding_window=sliding_window,
        )
    except ValueError as e:
        raise UserError(f"{meta_path}: {e}") from None
    ve_layers = sorted(int(m.group(1)) for k in state_dict if (m := _VE_KEY.fullmatch(k) or _GATE_KEY.fullmatch(k)))
    wrong = [i for i in ve_layers if i not in config.value_embedding_layers]
    if wrong:
        key = next(
            k
            for k in state_dict
            if (m := _VE_KEY.fullmatch(k) or _GATE_KEY.fullmatch(k)) and int(m.group(1)) == wrong[0]
        )
        raise UserError(
            f"{model_path}: {key} is on layer {wrong[0]}, but nanochat puts value embeddings on layers "
            f"{config.value_embedding_layers} of {n_layer} (i % 2 == (n_layer - 1) % 2)"
        )
    return config


# ------------------------------------------------------------------------------------- config -> nanochat


def generation_of(config: NanoChatGPTConfig, config_path: Path) -> Generation:
    """The nanochat generation whose model `config` describes (G1 for G1's fields without a sliding layer: the
    same model as G2 with window_pattern "L"), or a one-line UserError naming `config_path` and the fields."""
    fields = _fields(config)
    windowed = "sliding_attention" in config.layer_types
    for generation in GENERATIONS:
        if generation.name == "G2" or _generation_fields(generation) != fields:
            continue  # G2 has G1's fields: G1's with a sliding layer are G2
        if windowed and generation.name == "G1":
            generation = BY_NAME["G2"]
        if windowed and not generation.windows:
            break  # G0 with sliding layers
        padded = -(-config.vocab_size // PAD_VOCAB_SIZE_TO) * PAD_VOCAB_SIZE_TO
        if config.padded_vocab_size != padded and (generation.name != "G0" or config.pad_vocab_size_to != 1):
            raise UserError(
                f"{config_path}: pad_vocab_size_to {config.pad_vocab_size_to}: nanochat pads the "
                f"vocabulary to a multiple of {PAD_VOCAB_SIZE_TO} ({generation.name})"
            )
        return generation
    g0 = _generation_fields(GENERATIONS[0])
    differ = ", ".join(f"{k}={v!r}" for k, v in fields.items() if v != g0.get(k)) or "none"
    raise UserError(
        f"{config_path}: no nanochat generation (G0-G5) has these fields: {differ}"
        f"{', sliding layers' if windowed else ''}"
    )


def meta_model_config(config: NanoChatGPTConfig, window_pattern: str | None) -> dict:
    """The ``model_config`` block nanochat writes in ``meta_<step>.json``: GPTConfig's fields, ``window_pattern``
    from G2 on (G1's loader, aa530cd, refuses the field)."""
    model_config = {k: getattr(config, k) for k in NANOCHAT_CONFIG_KEYS}
    if window_pattern is not None:
        model_config["window_pattern"] = window_pattern
    return model_config
