"""Resolve --model_source into (model, tokenizer): demo, nanochat checkpoint, local HF dir, or hub repo id."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..conversion import find_nanochat_checkpoint, load_from_nanochat, nanochat_tokenizer_dir
from ..conversion.files import check_positive_ints
from ..conversion.generations import BY_NAME, layer_windows
from ..data.demo import DEMO_SEQUENCE_LEN, demo_tokenizer
from ..errors import UserError, one_line
from ..jsonfile import read_json
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from ..tokenizer.chat_format import ASSISTANT_END, ASSISTANT_START, BOS, EOS_TOKEN
from .arguments import MidTrainingArguments


def _is_nanochat_dir(path: Path) -> bool:
    """A nanochat base dir (has *_checkpoints/), a checkpoints dir (has model tags), or a tag dir (model_*.pt)."""
    if any(path.glob("model_*.pt")) or any(path.glob("*_checkpoints")):
        return True
    return any(p.is_dir() and any(p.glob("model_*.pt")) for p in path.iterdir())


def _load_nanochat(path: Path, args: MidTrainingArguments):
    if any(path.glob("model_*.pt")):  # a model tag directory
        checkpoint_dir = path
    else:
        base = path if any(path.glob("*_checkpoints")) else path.parent
        checkpoint_dir, args.step = find_nanochat_checkpoint(
            base, source=args.checkpoint_source, model_tag=args.model_tag, step=args.step
        )
    tokenizer_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else nanochat_tokenizer_dir(checkpoint_dir)
    if not (tokenizer_dir / "tokenizer.pkl").is_file():
        raise FileNotFoundError(
            f"no nanochat tokenizer at {tokenizer_dir / 'tokenizer.pkl'} (pass --tokenizer_dir DIR)"
        )
    return load_from_nanochat(checkpoint_dir, tokenizer_dir, step=args.step, trust_pickle=args.trust_pickle)


def load_hf_dir(path: Path, dtype: torch.dtype | None = None):
    """(model, tokenizer) by from_pretrained of a local directory, with one-line errors naming the damaged or missing
    file or field, found before the weights are read (mid_train's --model_source, chat_eval.py's --model)."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"{path}: no tokenizer in the model folder (tokenizer.json expected; save it with "
            "tokenizer.save_pretrained next to the model)"
        )
    config_path = path / "config.json"
    raw = read_json(config_path)
    if not isinstance(raw.get("model_type"), str):
        raise UserError(f"{config_path}: no 'model_type' (a Hugging Face model config names its model type)")
    if raw["model_type"] == NanoChatGPTConfig.model_type:
        check_positive_ints(
            raw, ("sequence_len", "vocab_size", "n_layer", "n_head", "n_embd"), ("n_kv_head",), str(config_path)
        )
    for weights in sorted(path.glob("*.safetensors")):  # reads only the header: cheap, and names the bad file
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise UserError(f"{weights}: not a readable safetensors file ({one_line(e)})") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError, TypeError, KeyError, SafetensorError) as e:
        raise UserError(f"{path}: the model cannot be loaded ({one_line(e)})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 -- tokenizers raises plain Exception on a damaged tokenizer.json
        raise UserError(f"{path}: the tokenizer cannot be loaded ({one_line(e)})") from None
    return model, tokenizer


def load_pretrained(name: str, dtype: torch.dtype | None = None, flag: str = "--model"):
    """(model, tokenizer) of a local model folder (`load_hf_dir`) or a Hub repo id; UserError in one line naming
    `flag` and `name` when there is no such folder or the Hub's cannot be loaded (chat.py's, chat_eval.py's --model)."""
    local = Path(name).expanduser()
    if local.is_dir():
        return load_hf_dir(local, dtype)
    if local.is_absolute() or name.startswith((".", "~")):
        raise UserError(f"{flag} {name}: no such model directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError) as e:  # ValueError: e.g. the model config's own checks
        raise UserError(f"{flag} {name}: cannot be loaded ({one_line(e)})") from None
    return model, tokenizer


def _demo_model(args: MidTrainingArguments):
    tokenizer = demo_tokenizer()
    if args.demo_generation not in BY_NAME:
        raise UserError(f"demo_generation {args.demo_generation!r}: expected one of {', '.join(BY_NAME)}")
    generation, sequence_len = BY_NAME[args.demo_generation], max(args.max_seq_len, DEMO_SEQUENCE_LEN)
    # nanochat's defaults of that generation: its window_pattern "SSSL", the vocabulary padded to 64 (bc51da8, G1 on)
    layer_types, sliding_window = layer_windows(generation, "SSSL", sequence_len, args.demo_depth)
    config = NanoChatGPTConfig.from_depth(
        args.demo_depth,
        vocab_size=len(tokenizer),
        sequence_len=sequence_len,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.pad_token_id,
        pad_vocab_size_to=1 if generation.name == "G0" else 64,
        layer_types=layer_types,
        sliding_window=sliding_window,
        **generation.fields,
    )
    torch.manual_seed(args.seed)
    return NanoChatGPTForCausalLM(config), tokenizer


def load_model_and_tokenizer(args: MidTrainingArguments):
    """Build/load the model and tokenizer named by args.model_source; raises one-line errors on bad input."""
    source = args.model_source
    if source in (None, "", "demo"):
        model, tokenizer = _demo_model(args)
    else:
        path = Path(source).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            model, tokenizer = load_hf_dir(path)
        elif path.is_dir() and _is_nanochat_dir(path):
            model, tokenizer = _load_nanochat(path, args)
        elif path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
            raise UserError(
                f"model_source={source!r}: not a Hugging Face model dir (config.json), a nanochat checkpoint dir "
                "(model_<step>.pt / base_checkpoints/), a hub repo id (user/name), or 'demo'"
            )
        else:  # hub repo id
            try:
                model = AutoModelForCausalLM.from_pretrained(source)
                tokenizer = AutoTokenizer.from_pretrained(source)
            except (OSError, ValueError, TypeError, KeyError) as e:  # ValueError: e.g. the config's own checks
                raise UserError(f"model_source={source!r}: could not load it from the hub ({one_line(e)})") from None
    if tokenizer is None:
        raise FileNotFoundError(f"model_source={source!r}: no tokenizer found")
    check_compatible(model, tokenizer, args)
    tokenizer.model_max_length = model.config.sequence_len  # the final save writes it beside the model
    return model, tokenizer


def check_compatible(model, tokenizer, args: MidTrainingArguments) -> None:
    vocab = model.config.vocab_size
    if len(tokenizer) > vocab:
        raise UserError(f"vocab mismatch: tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}")
    missing = [t for t in (BOS, ASSISTANT_START, ASSISTANT_END) if t not in tokenizer.get_vocab()]
    if missing:
        raise UserError(f"tokenizer lacks nanochat's special token(s) {', '.join(missing)}")
    if args.max_seq_len > model.config.sequence_len:
        # rotary tables cover sequence_len positions (nanochat precomputes 10x; ours are computed on the fly)
        model.config.sequence_len = args.max_seq_len
