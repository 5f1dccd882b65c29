"""--model_source: a nanochat base directory is converted on the fly (model tag / step as nanochat)."""

import json

import pytest
import torch

pytestmark = pytest.mark.slow


def test_nanochat_checkpoint_source(tmp_path, tiny_args):
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.tokenizer import save_nanochat_tokenizer
    from nanochat_hf.training.run import main

    tok = demo_tokenizer()
    config = NanoChatGPTConfig(vocab_size=len(tok), n_layer=1, n_head=1, n_kv_head=1, n_embd=64, sequence_len=64)
    torch.manual_seed(1)
    model = NanoChatGPTForCausalLM(config)
    torch.nn.init.normal_(model.lm_head.weight, std=0.02)  # a "trained" (non-zero) head
    base = tmp_path / "nanochat"
    ckpt = base / "base_checkpoints" / "d1"
    ckpt.mkdir(parents=True)
    for step in (3, 7):  # the latest step is the default
        torch.save({k: v * (step == 7) for k, v in model.state_dict().items()}, ckpt / f"model_{step:06d}.pt")
        (ckpt / f"meta_{step:06d}.json").write_text(
            json.dumps({"step": step, "model_config": config.to_nanochat_dict()})
        )
    save_nanochat_tokenizer(tok, base / "tokenizer")

    out = tmp_path / "out"
    argv = [
        *tiny_args,
        "--num_iterations",
        "1",
        "--spelling_eval_rows",
        "0",
        "--output_dir",
        str(out),
        "--model_source",
        str(base),
        "--trust_pickle",
        "true",
        "--matrix_lr",
        "0",
        "--embedding_lr",
        "0",
        "--unembedding_lr",
        "0",
    ]  # weights stay as loaded
    metrics = main(argv)
    assert metrics["steps"] == 1
    loaded = NanoChatGPTForCausalLM.from_pretrained(out)
    assert loaded.config.n_layer == 1 and loaded.config.vocab_size == len(tok)
    for name, value in model.state_dict().items():  # the latest step (7) was converted, not step 3 (zeros)
        torch.testing.assert_close(loaded.state_dict()[name], value, msg=name)
    assert (out / "README.md").read_text().count(str(base)) >= 1  # the card names the base model
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64  # the sequence_len


def test_demo_model_follows_nanochats_depth_rule():
    """The demo model is NanoChatGPTConfig.from_depth(demo_depth): depth 4 -> width 256, 2 heads of 128."""
    from nanochat_hf.training.arguments import parse_args
    from nanochat_hf.training.model_source import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(parse_args([]))
    config = model.config
    assert (config.n_layer, config.n_embd, config.n_head, config.n_kv_head) == (4, 256, 2, 2)
    assert config.vocab_size == len(tokenizer) and config.sequence_len == 1024


def test_demo_model_of_todays_generation():
    """--demo_generation G5: nanochat's G5 model at the demo's size (SSSL windows with G5's short window for the
    demo's context, vocabulary padded to 64, value embeddings, smear, backout), initialised as nanochat's
    init_weights (zero output projections, smear_lambda 0, backout_lambda 0.2); an unknown generation is one line."""
    from nanochat_hf.training.arguments import parse_args
    from nanochat_hf.training.model_source import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(parse_args(["--demo_generation", "G5"]))
    c = model.config
    assert c.layer_types == ["sliding_attention"] * 3 + ["full_attention"] and c.sliding_window == 256 + 1
    assert (c.padded_vocab_size % 64, c.value_embeddings, c.smear, c.backout, c.qk_scale) == (0, True, True, True, 1.2)
    t = model.transformer
    assert t.smear_lambda.item() == 0.0 and t.backout_lambda.item() == pytest.approx(0.2)
    assert all(block.attn.c_proj.weight.abs().max() == 0 for block in t.h)
    with pytest.raises(ValueError, match="demo_generation 'G9': expected one of G0, G1, G2, G3, G4, G5"):
        load_model_and_tokenizer(parse_args(["--demo_generation", "G9"]))
