"""ONNX export of the decoder with its KV cache, in the layout Optimum writes for causal LMs and transformers.js reads.

    <output>/config.json, generation_config.json, tokenizer files      (as the source model folder has them)
    <output>/onnx/model.onnx             float32
    <output>/onnx/model_quantized.onnx   int8 weights (onnxruntime's quantize_dynamic; transformers.js's "q8")

Inputs ``input_ids`` (batch, sequence), ``attention_mask`` (batch, past + sequence), ``position_ids`` (batch,
sequence), ``past_key_values.{i}.key`` / ``.value`` (batch, n_kv_head, past, head_dim); outputs ``logits`` (batch,
sequence, vocab_size) and ``present.{i}.key`` / ``.value`` (the past with the new tokens appended). A first step
passes empty pasts (past = 0). The graph is our model's own forward (traced, so the same code computes the logits)
with the cache and the masks handed to it as tensors:

- Every generation exports (G0 to G5). G0's config.json is transformers' native NanoChat config (``model_type
  "nanochat"``, ``NanoChatForCausalLM``), which is what transformers.js loads nanochat from; the later ones keep our
  config (transformers' and transformers.js's NanoChat have none of their features), for onnxruntime directly.
- Sliding-window layers (G2 on) get their window as a mask over the whole past (the past is never trimmed, as
  Optimum's caches are not), which gives the same keys as the model's own cache.
- Smear (G5) mixes the previous token's embedding into the first new position, and no key or value holds it: G5's
  graph has one more input, ``previous_input_ids`` (batch,), the token before ``input_ids`` (any value on a first
  step, where nothing is mixed into position 0), as our model's forward takes it.

The legacy TorchScript exporter (``dynamo=False``) is used: tracing fixes the Python control flow at one example
(a non-empty past, which is also the general path: see ``Decoder``) and records the size arithmetic, so one graph
takes any batch, sequence and past length; torch.export instead needs every data-dependent branch of the model and
of transformers' cache written for it. The tracer lacks two things the model uses: ``aten::rms_norm`` (ONNX has it
from opset 23 only), given here as its formula, and the bit view that rounds nanochat's bfloat16 rotary tables, for
which the model casts when traced (onnxruntime's Cast rounds to nearest even, as torch does).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache

from ..atomic import staged_dir
from ..errors import UserError
from ..jsonfile import read_json, write_json
from ..model import NanoChatGPTConfig, NanoChatGPTForCausalLM
from ..model.modeling_nanochat_gpt import CACHE
from .files import check_output, files_in
from .generations import generation_of, hf_names
from .native import CARRIED_FILES, native_config, read_hf_model

OPSET = 17
FLOAT32, INT8 = "onnx/model.onnx", "onnx/model_quantized.onnx"
EXTERNAL_DATA_SUFFIX = "_data"  # onnx/model.onnx_data for a model past protobuf's 2 GB (transformers.js's name)
MISSING = "to-onnx needs onnx, onnxscript and onnxruntime: pip install 'nanochat-hf[onnx]'"


def input_names(config: NanoChatGPTConfig) -> list[str]:
    names = ["input_ids", "attention_mask", "position_ids"]
    names += [f"past_key_values.{i}.{kv}" for i in range(config.n_layer) for kv in ("key", "value")]
    return names + (["previous_input_ids"] if config.smear else [])


def output_names(config: NanoChatGPTConfig) -> list[str]:
    return ["logits"] + [f"present.{i}.{kv}" for i in range(config.n_layer) for kv in ("key", "value")]


class Decoder(torch.nn.Module):
    """Our causal LM with its cache as flat tensors (Optimum's decoder signature): builds a DynamicCache from the
    pasts, one boolean mask per layer type from ``attention_mask`` (the model takes masks already built as a dict),
    and returns the logits and the grown pasts. The one branch on the past's length, smear's (G5), is traced with a
    non-empty past: that path prepends ``previous_input_ids`` and zeroes the gate at position 0, which on an empty
    past gives what the other path computes."""

    def __init__(self, model: NanoChatGPTForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past_and_previous):
        c = self.model.config
        pasts = past_and_previous[: 2 * c.n_layer]
        cache = DynamicCache(list(zip(pasts[0::2], pasts[1::2])))
        seq = input_ids.shape[1]
        total = attention_mask.shape[1]
        keys = torch.arange(total, device=input_ids.device)
        queries = keys[total - seq :, None]  # the key slot of each new token
        causal = keys <= queries  # (seq, total)
        # a query sees the keys before it that are not padding, and always itself (a padding row stays finite)
        visible = (attention_mask.bool()[:, None, None, :] & causal) | (keys == queries)
        masks = {"full_attention": visible}
        if "sliding_attention" in c.layer_types:  # the last `sliding_window` keys, itself included
            masks["sliding_attention"] = visible & (keys > queries - c.sliding_window)
        extra = {"previous_input_ids": past_and_previous[-1]} if c.smear else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=masks,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            **extra,
        )
        presents = [t for layer in getattr(out, CACHE).layers for t in (layer.keys, layer.values)]
        return (out.logits, *presents)


class OnnxDecoder:
    """An exported decoder in onnxruntime (CPU), decoded as transformers.js does: empty pasts on the first step, then
    each step feeds the ``present.*`` outputs back as ``past_key_values.*`` with the new token alone. The inputs it
    feeds are the graph's own (``previous_input_ids`` only for G5); the cache's shape is read from the graph too."""

    def __init__(self, path: str | os.PathLike, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        self.pasts = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]

    def empty(self, batch: int) -> list[np.ndarray]:
        return [np.zeros((batch, p.shape[1], 0, p.shape[3]), np.float32) for p in self.pasts]

    def __call__(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        pasts: list[np.ndarray],
        previous: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, presents) of one step; `previous`: the token before each row's `ids` (G5's smear)."""
        if previous is None:
            previous = np.zeros(len(ids), np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "previous_input_ids": previous}
        feed.update(zip([p.name for p in self.pasts], pasts))
        logits, *presents = self.session.run(None, {name: feed[name] for name in self.names})
        return logits, presents

    def greedy(self, prompts: list[list[int]], steps: int, pad: int = 0) -> list[list[int]]:
        """`steps` greedy tokens after each prompt (left-padded with `pad`; positions count from each row's first
        real token, as generate() does)."""
        width = max(map(len, prompts))
        ids = np.array([[pad] * (width - len(p)) + p for p in prompts], np.int64)
        mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
        pasts, previous, out = self.empty(len(prompts)), None, []
        for _ in range(steps):
            positions = np.clip(mask.cumsum(-1) - 1, 0, None)[:, -ids.shape[1] :]
            logits, pasts = self(ids, mask, positions, pasts, previous)
            previous, ids = ids[:, -1], logits[:, -1].argmax(-1)[:, None]
            mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
            out.append(ids[:, 0])
        return np.stack(out, axis=1).tolist()


def load_for_export(model_dir: Path) -> NanoChatGPTForCausalLM:
    """The model of `model_dir` (ours or transformers' native NanoChat) in float32 with eager attention (plain
    matmul-softmax: the graph needs no attention kernel onnxruntime may lack)."""
    state_dict, config = read_hf_model(model_dir)
    generation_of(config, model_dir / "config.json")  # a combination of fields no nanochat had: one line here
    config._attn_implementation = "eager"
    model = NanoChatGPTForCausalLM(config)
    names = hf_names(config)
    model.load_state_dict({names.get(k, k): v.float() for k, v in state_dict.items()}, strict=True)
    return model.float().eval()


def example_inputs(config: NanoChatGPTConfig, batch: int = 2, seq: int = 3, past: int = 4) -> tuple[torch.Tensor, ...]:
    """Inputs with a non-empty past, the path that covers every step (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    shape = (batch, config.n_kv_head, past, config.head_dim)
    pasts = [torch.randn(shape, generator=g) for _ in range(2 * config.n_layer)]
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    positions = torch.arange(past, past + seq).expand(batch, -1)
    previous = [torch.randint(0, config.vocab_size, (batch,), generator=g)] if config.smear else []
    return (ids, mask, positions, *pasts, *previous)


def _rms_norm(g, x, normalized_shape, weight, eps):
    """aten::rms_norm, which the TorchScript exporter has no symbolic for (ONNX has RMSNormalization from opset 23
    only): ``x / sqrt(mean(x^2, -1) + eps)`` with float32's eps, F.rms_norm's default (our norms have no weight)."""
    eps = g.op("Constant", value_t=torch.tensor(torch.finfo(torch.float32).eps))
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), axes_i=[-1], keepdims_i=1)
    return g.op("Div", x, g.op("Sqrt", g.op("Add", mean_square, eps)))


def export_decoder(model: NanoChatGPTForCausalLM, path: Path) -> None:
    """`model`'s decoder as ONNX at `path`, alone in its folder (past protobuf's 2 GB the exporter writes the weights
    beside it, one file per tensor: see ``save_whole``)."""
    config = model.config
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
    }
    axes["attention_mask"] = {0: "batch_size", 1: "past_sequence_length + sequence_length"}
    axes["logits"] = {0: "batch_size", 1: "sequence_length"}
    for name in input_names(config)[3:]:
        axes[name] = {0: "batch_size"} if name == "previous_input_ids" else {0: "batch_size", 2: "past_sequence_length"}
    for name in output_names(config)[1:]:
        axes[name] = {0: "batch_size", 2: "past_sequence_length + sequence_length"}
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm, OPSET)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the traced branches are the general ones
            warnings.simplefilter("ignore", DeprecationWarning)  # "legacy exporter": chosen (the module docstring)
            torch.onnx.export(
                Decoder(model),
                example_inputs(config),
                str(path),
                input_names=input_names(config),
                output_names=output_names(config),
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::rms_norm", OPSET)


def save_whole(graph: Path, target: Path) -> None:
    """Move `graph`, alone in a scratch folder (the exporter's or the quantizer's), to `target`. Past protobuf's 2 GB
    they write its weights as external data beside it (torch: one file per tensor): those go to one file,
    `<target>_data`, the name transformers.js looks for."""
    import onnx

    if not any(p != graph for p in graph.parent.iterdir()):
        os.replace(graph, target)
        return
    proto = onnx.load(str(graph))  # reads the external data
    onnx.save(proto, str(target), save_as_external_data=True, location=target.name + EXTERNAL_DATA_SUFFIX)


def quantize(source: Path, path: Path) -> None:
    """int8 weights, activations quantized on the fly (onnxruntime's dynamic quantization, Optimum's "q8")."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    external = source.with_name(source.name + EXTERNAL_DATA_SUFFIX).exists()
    quantize_dynamic(source, path, weight_type=QuantType.QInt8, use_external_data_format=external)


def to_onnx(model_dir: str | os.PathLike, output_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Export our model directory (or transformers' native NanoChat) to ONNX with a KV cache, float32 and int8.

    `output_dir` must be new or empty and apart from the source; `overwrite` lets it replace the files it writes
    (other files are kept; the source's files are never replaced)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401  (torch.onnx imports it)
    except ImportError:
        raise UserError(MISSING) from None
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    check_output(output_dir, [model_dir], overwrite)
    model = load_for_export(model_dir)
    config = model.config
    with staged_dir(output_dir, overwrite, protect=files_in(model_dir)) as tmp:
        (tmp / FLOAT32).parent.mkdir()
        with tempfile.TemporaryDirectory(dir=tmp) as scratch:  # each graph alone in a folder: see save_whole
            export_decoder(model, Path(scratch) / "model.onnx")
            save_whole(Path(scratch) / "model.onnx", tmp / FLOAT32)
        with tempfile.TemporaryDirectory(dir=tmp) as scratch:
            quantize(tmp / FLOAT32, Path(scratch) / "model.onnx")
            save_whole(Path(scratch) / "model.onnx", tmp / INT8)
        if generation_of(config, model_dir / "config.json").name == "G0":
            native_config(config).save_pretrained(tmp)  # what transformers.js reads nanochat from
        else:
            config.save_pretrained(tmp)
        external = {
            p.name: 1
            for p in (tmp / FLOAT32).parent.glob("*.onnx")
            if p.with_name(p.name + EXTERNAL_DATA_SUFFIX).exists()
        }
        if external:  # transformers.js fetches <name>_data only when told so, per file: the number of data files
            raw = read_json(tmp / "config.json")
            write_json(tmp / "config.json", {**raw, "transformers.js_config": {"use_external_data_format": external}})
        for path in model_dir.iterdir():
            if path.is_file() and CARRIED_FILES.fullmatch(path.name):
                shutil.copyfile(path, tmp / path.name)  # not copy2: the mode comes from the umask
        if not (tmp / "generation_config.json").exists():
            GenerationConfig.from_model_config(config).save_pretrained(tmp)
    return output_dir
