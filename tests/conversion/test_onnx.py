"""`convert.py to-onnx`: the exported decoder run by onnxruntime on CPU against our torch model.

The models are the suite's nanochat checkpoints of G0 (December 2025) and G5 (HEAD), converted by from-nanochat
(3 layers; G5's short layers have a 129-key window, so a 110-token prompt and 32 new tokens go past it). Each is
exported once per module. The decoding loop is transformers.js's (`OnnxDecoder`: empty pasts first, then each step
feeds the `present.*` outputs back as `past_key_values.*` with the new token alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nanochat_hf import NanoChatGPTForCausalLM
from nanochat_hf.conversion import from_nanochat, to_onnx
from nanochat_hf.conversion import onnx as onnx_export
from nanochat_hf.conversion.onnx import OnnxDecoder
from nanochat_hf.errors import UserError

pytest.importorskip("onnxruntime")

COMMITS = {"G0": "790f3be", "G5": "a825e63"}
# transformers.js in Node, installed by .ci/run (npm install --ignore-scripts: its CPU onnxruntime ships in the package)
TRANSFORMERS_JS = Path(os.environ.get("NANOCHAT_TRANSFORMERS_JS", Path(__file__).parents[2] / ".ci" / "node"))
PROMPT = [(5 * i * i + 7 * i + 3) % 290 for i in range(110)]
NEW_TOKENS = 32


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """generate() on these tiny models is 20x slower with 2 threads on a loaded machine (spin-waits), as onnxruntime's
    sessions here also use one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def exported(generation_base, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """generation -> (our model folder, its ONNX export)."""
    out = {}
    for gen, commit in COMMITS.items():
        root = tmp_path_factory.mktemp(f"onnx_{gen}")
        model = from_nanochat(
            generation_base / "base_checkpoints" / commit, root / "hf", generation_base / "tokenizer", trust_pickle=True
        )
        out[gen] = model, to_onnx(model, root / "onnx_export")
    return out


@pytest.fixture(scope="module")
def torch_models(exported) -> dict[str, NanoChatGPTForCausalLM]:
    return {gen: NanoChatGPTForCausalLM.from_pretrained(model).float().eval() for gen, (model, _) in exported.items()}


def session(path: Path):
    return OnnxDecoder(path).session


def test_optimum_layout_names_and_files(exported):
    model, out = exported["G0"]
    assert {p.name for p in (out / "onnx").iterdir()} == {"model.onnx", "model_quantized.onnx"}
    config = json.loads((out / "config.json").read_text())  # G0: transformers' NanoChat, what transformers.js reads
    assert config["model_type"] == "nanochat" and config["architectures"] == ["NanoChatForCausalLM"]
    assert config["num_key_value_heads"] == 2 and config["num_hidden_layers"] == 3
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (model / name).read_bytes()
    graph = session(out / "onnx" / "model.onnx")
    inputs = {i.name: i.shape for i in graph.get_inputs()}
    pasts = [f"past_key_values.{i}.{kv}" for i in range(3) for kv in ("key", "value")]
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", *pasts]
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert inputs["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
    outputs = [o.name for o in graph.get_outputs()]
    assert outputs == ["logits"] + [p.replace("past_key_values", "present") for p in pasts]
    g5 = json.loads((exported["G5"][1] / "config.json").read_text())
    assert g5["model_type"] == "nanochat_gpt" and g5["smear"]  # our config: only we know G5
    assert [i.name for i in session(exported["G5"][1] / "onnx" / "model.onnx").get_inputs()][-1] == "previous_input_ids"


@pytest.mark.parametrize("gen", list(COMMITS))
def test_logits_equal_the_torch_model(gen, exported, torch_models):
    """The whole prompt at once, then its last 30 tokens again over a cache of the first 80 (past and new > 1)."""
    model = torch_models[gen]
    decoder = OnnxDecoder(exported[gen][1] / "onnx" / "model.onnx")
    ids = np.array([PROMPT + PROMPT[:40]])  # 150 tokens: past G5's window
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).logits.numpy()
    n = ids.shape[1]
    logits, _ = decoder(ids, np.ones((1, n), np.int64), np.arange(n)[None], decoder.empty(1), np.zeros(1, np.int64))
    assert np.abs(logits - want).max() < 1e-4
    _, pasts = decoder(ids[:, :120], np.ones((1, 120), np.int64), np.arange(120)[None], decoder.empty(1), ids[:, 0])
    logits, _ = decoder(ids[:, 120:], np.ones((1, n), np.int64), np.arange(120, n)[None], pasts, ids[:, 119])
    assert np.abs(logits - want[:, 120:]).max() < 1e-4


@pytest.mark.parametrize("gen", list(COMMITS))
def test_cached_greedy_tokens_equal_generate(gen, exported, torch_models):
    """A left-padded batch of two prompts, 32 tokens each, against generate() on the same batch."""
    model = torch_models[gen]
    prompts = [PROMPT, PROMPT[40:]]
    pad = model.config.pad_token_id
    decoder = OnnxDecoder(exported[gen][1] / "onnx" / "model.onnx")
    got = decoder.greedy(prompts, NEW_TOKENS, pad)
    ids = torch.tensor([PROMPT, [pad] * 40 + PROMPT[40:]])
    mask = torch.tensor([[1] * 110, [0] * 40 + [1] * 70])
    with torch.no_grad():
        want = model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
    assert got == want[:, 110:].tolist()


def test_int8_runs_and_mostly_picks_the_same_tokens(exported):
    """Dynamic int8 quantization changes the logits, so tokens can differ; what must hold: it runs with the cache,
    and given the float32 model's greedy text, it picks the same next token at most positions (measured on these
    random weights: 31/32 for G0, 32/32 for G5)."""
    for gen in COMMITS:
        out = exported[gen][1] / "onnx"
        float32 = OnnxDecoder(out / "model.onnx").greedy([PROMPT], NEW_TOKENS, 0)[0]
        int8 = OnnxDecoder(out / "model_quantized.onnx")
        assert (out / "model_quantized.onnx").stat().st_size < (out / "model.onnx").stat().st_size / 2
        ids = np.array([PROMPT + float32])
        n = ids.shape[1]
        logits, _ = int8(ids, np.ones((1, n), np.int64), np.arange(n)[None], int8.empty(1), np.zeros(1, np.int64))
        picks = logits[0, len(PROMPT) - 1 : -1].argmax(-1)
        assert (picks == np.array(float32)).mean() >= 0.75, (gen, picks.tolist(), float32)


TRANSFORMERS_JS_CHECK = """
import { AutoModelForCausalLM, Tensor, env } from '@huggingface/transformers';
const { folder, name, prompt } = JSON.parse(process.env.CHECK);
env.allowRemoteModels = false;
env.localModelPath = folder;
const out = {};
for (const dtype of ['fp32', 'q8']) {  // onnx/model.onnx, onnx/model_quantized.onnx
  const model = await AutoModelForCausalLM.from_pretrained(name, { dtype });
  const input_ids = new Tensor('int64', BigInt64Array.from(prompt.map(BigInt)), [1, prompt.length]);
  const ids = await model.generate({ input_ids, max_new_tokens: 32, min_new_tokens: 32, do_sample: false });
  out[dtype] = { cls: model.constructor.name, tokens: Array.from(ids.data, Number).slice(prompt.length) };
}
console.log(JSON.stringify(out));
"""


@pytest.mark.multiprocess
def test_transformers_js_loads_g0_and_generates_the_same_tokens(exported, torch_models):
    """transformers.js (Node) reads the G0 export as nanochat (NanoChatForCausalLM): its own greedy loop, cache and
    position_ids give generate()'s tokens with the float32 graph; the int8 one (its default "q8") runs."""
    if not (TRANSFORMERS_JS / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip(f"transformers.js is not installed in {TRANSFORMERS_JS} (.ci/run installs it with npm)")
    out = exported["G0"][1]
    check = {"folder": f"{out.parent}/", "name": out.name, "prompt": PROMPT}
    result = subprocess.run(
        ["node", "--input-type=module", "-e", TRANSFORMERS_JS_CHECK],
        cwd=TRANSFORMERS_JS,
        env={**os.environ, "CHECK": json.dumps(check)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    with torch.no_grad():
        want = torch_models["G0"].generate(
            torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
    assert got["fp32"] == {"cls": "NanoChatForCausalLM", "tokens": want[0, len(PROMPT) :].tolist()}
    assert got["q8"]["cls"] == "NanoChatForCausalLM" and len(got["q8"]["tokens"]) == NEW_TOKENS


def test_weights_past_2gb_go_to_one_data_file_transformers_js_is_told_of(exported, monkeypatch, tmp_path):
    """Past protobuf's 2 GB torch writes one file per tensor beside the graph (too big to make here: the export is
    made to come out so, with onnx's own writer), and the quantizer its own data file: each graph gets one
    `<name>_data` file, config.json says so to transformers.js, and both compute what the one-file export does."""
    import onnx

    export_decoder = onnx_export.export_decoder

    def export_in_pieces(model, path):
        export_decoder(model, path)
        onnx.save(onnx.load(str(path)), str(path), save_as_external_data=True, all_tensors_to_one_file=False)

    monkeypatch.setattr(onnx_export, "export_decoder", export_in_pieces)
    out = to_onnx(exported["G0"][0], tmp_path / "out")
    names = ["model.onnx", "model.onnx_data", "model_quantized.onnx", "model_quantized.onnx_data"]
    assert sorted(p.name for p in (out / "onnx").iterdir()) == names
    config = json.loads((out / "config.json").read_text())
    assert config["transformers.js_config"] == {
        "use_external_data_format": {"model.onnx": 1, "model_quantized.onnx": 1}
    }
    ids = np.array([PROMPT[:20]])
    inputs = (ids, np.ones((1, 20), np.int64), np.arange(20)[None])
    for name in ("model.onnx", "model_quantized.onnx"):
        whole, pieces = OnnxDecoder(exported["G0"][1] / "onnx" / name), OnnxDecoder(out / "onnx" / name)
        assert np.array_equal(whole(*inputs, whole.empty(1))[0], pieces(*inputs, pieces.empty(1))[0])


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_nothing_is_written(exported, load_script, capsys, tmp_path):
    main = load_script("convert").main
    model = exported["G0"][0]

    def run(*args) -> str:
        assert main(["to-onnx", *map(str, args)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("convert: error: "), err
        return err[0]

    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "a.txt").write_text("hello")
    assert "notes/config.json" in run("--model", not_a_model, "--output", tmp_path / "out")
    assert not (tmp_path / "out").exists()

    taken = tmp_path / "taken"
    (taken / "onnx").mkdir(parents=True)
    (taken / "onnx" / "model.onnx").write_text("mine")
    assert "--output is not empty" in run("--model", model, "--output", taken)
    assert [p.name for p in taken.rglob("*")] == ["onnx", "model.onnx"]
    assert (taken / "onnx" / "model.onnx").read_text() == "mine"

    odd = tmp_path / "odd"  # a G0 model with G4's q/k scale: no nanochat generation is that model
    odd.mkdir()
    for path in model.iterdir():
        (odd / path.name).write_bytes(path.read_bytes())
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "qk_scale": 1.3}))
    line = run("--model", odd, "--output", tmp_path / "out")
    assert "odd/config.json" in line and "no nanochat generation" in line and "qk_scale=1.3" in line
    assert not (tmp_path / "out").exists()


def test_without_the_onnx_extra_it_says_what_to_install(exported, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'nanochat-hf\[onnx\]'"):
        to_onnx(exported["G0"][0], tmp_path / "out")
    assert not (tmp_path / "out").exists()
