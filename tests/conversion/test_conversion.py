"""nanochat checkpoint -> Hugging Face dir -> (fresh process | nanochat again | transformers' native NanoChat)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.conversion import find_nanochat_checkpoint, load_from_nanochat, to_nanochat, to_native
from nanochat_hf.errors import UserError
from nanochat_hf.tokenizer import SPECIAL_TOKENS, load_nanochat_tokenizer, token_bytes

SAMPLE = "the fox thinks: 12345 thoughts,  three\n\n  theses!  ünïcode 日本 <|bos|><|assistant_end|>"
IDS = [[291, 292, 116, 104, 101, 32, 102, 111, 120, 293, 294, 32, 116, 104]]


def original_state_dict(nanochat_base: Path, step: int = 5) -> dict[str, torch.Tensor]:
    sd = torch.load(nanochat_base / "base_checkpoints" / "d2" / f"model_{step:06d}.pt", weights_only=True)
    return {k.removeprefix("_orig_mod."): v for k, v in sd.items()}


def reference_model(nanochat_base: Path, **overrides) -> NanoChatGPTForCausalLM:
    meta = json.loads((nanochat_base / "base_checkpoints" / "d2" / "meta_000005.json").read_text())
    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(**meta["model_config"], **overrides))
    model.load_state_dict({k: v.float() for k, v in original_state_dict(nanochat_base).items()}, strict=True)
    return model.eval()


def tiktoken_encoding(nanochat_base: Path):
    with open(nanochat_base / "tokenizer" / "tokenizer.pkl", "rb") as f:
        return pickle.load(f)  # our own test file


def test_from_nanochat_writes_a_complete_hf_dir(hf_dir, nanochat_base):
    names = {p.name for p in hf_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "modeling_nanochat_gpt.py",
        "configuration_nanochat_gpt.py",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    # latest step picked, `_orig_mod.` stripped, dtypes kept (bf16 embedding, float32 rest), values unchanged
    weights = load_file(hf_dir / "model.safetensors")
    original = original_state_dict(nanochat_base)
    assert weights.keys() == original.keys()
    assert weights["transformer.wte.weight"].dtype == torch.bfloat16
    assert all(torch.equal(weights[k], original[k]) for k in original)
    assert json.loads((hf_dir / "nanochat_meta.json").read_text())["step"] == 5
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    enc = tiktoken_encoding(nanochat_base)
    assert tokenizer(SAMPLE, add_special_tokens=False)["input_ids"] == enc.encode(SAMPLE, allowed_special="all")
    assert tokenizer(SAMPLE)["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer.model_max_length == 64  # the model's sequence_len, not 1e30
    assert tokenizer.chat_template and "<|assistant_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    config = json.loads((hf_dir / "config.json").read_text())
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    special = {tok: 291 + i for i, tok in enumerate(SPECIAL_TOKENS)}
    assert config["bos_token_id"] == special["<|bos|>"]
    assert generation["eos_token_id"] == config["eos_token_id"] == special["<|assistant_end|>"]


def test_dtype_cast_on_request(nanochat_base, tmp_path):
    from nanochat_hf.conversion import from_nanochat

    out = from_nanochat(
        nanochat_base / "base_checkpoints" / "d2",
        tmp_path / "bf16",
        nanochat_base / "tokenizer",
        dtype="bfloat16",
        trust_pickle=True,
        step=2,
    )
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


# Makes `import nanochat_hf` fail in the child process although the package is installed (editable) in the venv.
LOAD_AND_RUN = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, out, mode = sys.argv[1:4]
if mode == "package":
    import nanochat_hf
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__module__.startswith("nanochat_hf."), type(model).__module__
else:
    try:
        import nanochat_hf
        raise SystemExit("nanochat_hf should not be importable here")
    except ModuleNotFoundError:
        pass
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
tokenizer = AutoTokenizer.from_pretrained(model_dir)
idx = torch.tensor(json.loads(sys.argv[4]))
with torch.no_grad():
    logits = model(idx).logits
    gen = model.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=6, do_sample=False)
torch.save({"logits": logits, "gen": gen, "vocab": len(tokenizer)}, out)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["package", "remote_code_only"])
def test_converted_dir_loads_in_a_fresh_process(hf_dir, nanochat_base, tmp_path, fresh_python, mode):
    reference = reference_model(nanochat_base)
    idx = torch.tensor(IDS)
    with torch.no_grad():
        expected = reference(idx).logits
        expected_gen = reference.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=6, do_sample=False)
    result = fresh_python(
        LOAD_AND_RUN, str(hf_dir), str(tmp_path / "out.pt"), mode, json.dumps(IDS), allow_package=mode == "package"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["vocab"] == 300
    assert (out["logits"] - expected).abs().max().item() < 1e-6
    assert torch.equal(out["gen"], expected_gen)


def test_round_trip_to_nanochat_is_bit_identical(hf_dir, nanochat_base, tmp_path):
    out_dir = tmp_path / "base_checkpoints" / "d2"  # nanochat's layout: the tokenizer goes to tmp_path/tokenizer
    out_dir.mkdir(parents=True)
    (out_dir / "model_000001.pt").write_bytes(b"another step, kept")
    assert to_nanochat(hf_dir, out_dir) == out_dir
    assert (out_dir / "model_000001.pt").read_bytes() == b"another step, kept"
    back = torch.load(out_dir / "model_000005.pt", weights_only=True)  # step taken from the source meta
    original = original_state_dict(nanochat_base)
    assert back.keys() == original.keys()
    for k, v in original.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    meta = json.loads((out_dir / "meta_000005.json").read_text())
    source_meta = json.loads((nanochat_base / "base_checkpoints" / "d2" / "meta_000005.json").read_text())
    assert meta["model_config"] == source_meta["model_config"] and meta["step"] == 5
    # the tokenizer goes back to nanochat's format, with the same ids and token byte lengths
    tokenizer = load_nanochat_tokenizer(tmp_path / "tokenizer", trust_pickle=True)
    assert tokenizer(SAMPLE, add_special_tokens=False)["input_ids"] == tiktoken_encoding(nanochat_base).encode(
        SAMPLE, allowed_special="all"
    )
    assert torch.equal(
        torch.load(tmp_path / "tokenizer" / "token_bytes.pt", weights_only=True),
        torch.load(nanochat_base / "tokenizer" / "token_bytes.pt", weights_only=True),
    )
    # an explicit step names the files
    to_nanochat(hf_dir, out_dir, step=123)
    assert (out_dir / "model_000123.pt").is_file() and (out_dir / "meta_000123.json").is_file()


def test_to_native_matches_float32_rotary_and_picks_the_closest_eps(hf_dir, nanochat_base, tmp_path):
    native_dir = to_native(hf_dir, tmp_path / "native")
    config = json.loads((native_dir / "config.json").read_text())
    assert config["model_type"] == "nanochat" and "auto_map" not in config
    assert not list(native_dir.glob("*.py"))
    native = AutoModelForCausalLM.from_pretrained(native_dir).eval()  # built-in class, no custom code
    assert type(native).__name__ == "NanoChatForCausalLM"
    assert native.config.rms_norm_eps == torch.finfo(torch.float32).eps
    idx = torch.tensor(IDS)
    ours_f32 = reference_model(nanochat_base, rotary_dtype="float32")
    ours_bf16 = reference_model(nanochat_base)
    with torch.no_grad():
        native_logits = native(idx).logits
        diff = (native_logits - ours_f32(idx).logits).abs().max().item()
        assert diff < 1e-4
        assert (native_logits - ours_bf16(idx).logits).abs().max().item() > diff  # the bf16 tables differ
        kw = dict(attention_mask=torch.ones_like(idx), max_new_tokens=6, do_sample=False)
        assert torch.equal(native.generate(idx, **kw), ours_f32.generate(idx, **kw))
        for module in native.modules():  # transformers' default eps would be further away
            if type(module).__name__ == "NanoChatRMSNorm":
                module.eps = 1e-6
        assert (native(idx).logits - ours_f32(idx).logits).abs().max().item() > diff
    # and a native directory converts back to nanochat's names and values
    to_nanochat(native_dir, tmp_path / "base_checkpoints" / "from_native", step=5)
    back = torch.load(tmp_path / "base_checkpoints" / "from_native" / "model_000005.pt", weights_only=True)
    original = original_state_dict(nanochat_base)
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in original)


def test_find_checkpoint_and_load_in_memory(nanochat_base, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(nanochat_base))
    checkpoint_dir, step = find_nanochat_checkpoint()
    assert checkpoint_dir == nanochat_base / "base_checkpoints" / "d2" and step == 5
    assert find_nanochat_checkpoint(step=2)[1] == 2
    with pytest.raises(FileNotFoundError, match="mid_checkpoints"):
        find_nanochat_checkpoint(source="mid")
    model, tokenizer = load_from_nanochat(checkpoint_dir, nanochat_base / "tokenizer", trust_pickle=True)
    assert model.dtype == torch.float32 and len(tokenizer) == 300
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    with torch.no_grad():
        assert torch.equal(model(torch.tensor(IDS)).logits, reference_model(nanochat_base)(torch.tensor(IDS)).logits)


# ------------------------------------------------------------------------------------------------ bad input


def _copy_checkpoint(nanochat_base: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    src = nanochat_base / "base_checkpoints" / "d2"
    for name in ("model_000005.pt", "meta_000005.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _break_meta(ckpt: Path, **changes) -> None:
    meta = json.loads((ckpt / "meta_000005.json").read_text())
    meta["model_config"].update(changes)
    (ckpt / "meta_000005.json").write_text(json.dumps(meta))


BAD_CHECKPOINTS = {
    # name: (how to break the checkpoint copy, expected error type, file named in the message, message part)
    "no_dir": (lambda c: __import__("shutil").rmtree(c), FileNotFoundError, "ckpt", "not found"),
    "no_model": (lambda c: (c / "model_000005.pt").unlink(), FileNotFoundError, "ckpt", "no model_<step>.pt"),
    "no_meta": (lambda c: (c / "meta_000005.json").unlink(), FileNotFoundError, "meta_000005.json", "no such file"),
    "bad_json": (lambda c: (c / "meta_000005.json").write_text("{oops"), UserError, "meta_000005.json", "JSON"),
    "no_model_config": (
        lambda c: (c / "meta_000005.json").write_text("{}"),
        UserError,
        "meta_000005.json",
        "model_config",
    ),
    "corrupt_weights": (
        lambda c: (c / "model_000005.pt").write_bytes(b"\x00garbage" * 10),
        UserError,
        "model_000005.pt",
        "cannot be read",
    ),
    "shape_mismatch": (
        lambda c: _break_meta(c, n_embd=128, n_head=8, n_kv_head=4),
        UserError,
        "model_000005.pt",
        "has shape",
    ),
    "layer_mismatch": (lambda c: _break_meta(c, n_layer=3), UserError, "model_000005.pt", "missing"),
    "tokenizer_vocab": (lambda c: _vocab_320(c), UserError, "tokenizer.pkl", "tokenizer has 300 tokens"),
}


def _vocab_320(ckpt: Path) -> None:
    sd = torch.load(ckpt / "model_000005.pt", weights_only=True)
    for k in ("_orig_mod.transformer.wte.weight", "_orig_mod.lm_head.weight"):
        sd[k] = torch.cat([sd[k], sd[k][:20]])
    torch.save(sd, ckpt / "model_000005.pt")
    _break_meta(ckpt, vocab_size=320)


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_bad_nanochat_input_gives_a_clear_error_and_writes_nothing(nanochat_base, tmp_path, case):
    from nanochat_hf.conversion import from_nanochat

    breaker, error, named, part = BAD_CHECKPOINTS[case]
    ckpt = _copy_checkpoint(nanochat_base, tmp_path / "ckpt")
    breaker(ckpt)
    out = tmp_path / "out" / "hf"
    with pytest.raises(error) as info:
        from_nanochat(ckpt, out, nanochat_base / "tokenizer", trust_pickle=True)
    message = str(info.value)
    assert "\n" not in message and named in message and part in message, message
    assert not out.exists() and not [p for p in (tmp_path / "out").glob("*")]


def test_untrusted_pickle_is_refused(nanochat_base, tmp_path):
    from nanochat_hf.conversion import from_nanochat

    with pytest.raises(UserError, match="trust_pickle=True"):
        from_nanochat(nanochat_base / "base_checkpoints" / "d2", tmp_path / "hf", nanochat_base / "tokenizer")
    assert not (tmp_path / "hf").exists()


def test_bad_hf_dir_gives_a_clear_error_and_writes_nothing(hf_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        (broken / name).write_bytes((hf_dir / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(UserError, match=r"model\.safetensors: cannot be read as safetensors"):
        to_nanochat(broken, tmp_path / "out")
    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors: no such file"):
        to_native(broken, tmp_path / "out")
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match=r"config\.json: model_type is 'llama'"):
        to_nanochat(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli(nanochat_base, tmp_path, capsys):
    import runpy

    main = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "convert.py"), run_name="convert")["main"]
    ckpt = nanochat_base / "base_checkpoints" / "d2"
    # tokenizer dir defaults to nanochat's layout: <checkpoint-dir>/../../tokenizer
    assert (
        main(
            [
                "from-nanochat",
                "--checkpoint-dir",
                str(ckpt),
                "--step",
                "2",
                "--output",
                str(tmp_path / "hf"),
                "--trust-pickle",
            ]
        )
        == 0
    )
    # the fixture is laid out as tok_train.py writes it (byte tokens 0x80-0xFF count 3), and the converted
    # tokenizer gives the same counts, so bits per byte computed from it equal nanochat's
    expected = torch.load(nanochat_base / "tokenizer" / "token_bytes.pt", weights_only=True)
    assert expected[128:256].tolist() == [3] * 128
    assert torch.equal(token_bytes(AutoTokenizer.from_pretrained(tmp_path / "hf")), expected.long())
    assert main(["to-native", "--model", str(tmp_path / "hf"), "--output", str(tmp_path / "native")]) == 0
    nc = tmp_path / "base" / "base_checkpoints" / "d2"
    assert main(["to-nanochat", "--model", str(tmp_path / "hf"), "--output", str(nc)]) == 0
    assert (nc / "model_000002.pt").is_file() and (tmp_path / "native" / "config.json").is_file()
    # both commands use nanochat's layout, so what to-nanochat wrote converts back with the defaults
    assert (tmp_path / "base" / "tokenizer" / "tokenizer.pkl").is_file()
    assert (
        main(["from-nanochat", "--checkpoint-dir", str(nc), "--output", str(tmp_path / "hf2"), "--trust-pickle"]) == 0
    )
    assert (
        load_file(tmp_path / "hf2" / "model.safetensors").keys()
        == load_file(tmp_path / "hf" / "model.safetensors").keys()
    )
    capsys.readouterr()
    assert main(["to-nanochat", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "nc2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convert: error: ") and "nope" in err and "\n" not in err
    # a folder outside nanochat's layout has no place for the tokenizer: refused in one line, nothing written
    assert main(["to-nanochat", "--model", str(tmp_path / "hf"), "--output", str(tmp_path / "elsewhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert "_checkpoints/<tag>" in err and "--tokenizer-output" in err and "\n" not in err
    assert not (tmp_path / "elsewhere").exists()
