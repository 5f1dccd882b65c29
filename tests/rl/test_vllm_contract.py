"""What TRL's vLLM rollout path (GRPOConfig(use_vllm=True)) needs from our model beyond what vLLM's transformers
backend needs to run it (tests/serving/test_vllm_contract.py): TRL's weight sync (`VLLMGeneration.sync_weights`,
`_iter_named_params`) pushes ``model.named_parameters()`` by name into the model vLLM loaded from the saved folder,
so every parameter must be in that folder's safetensors under its own name and shape, and the backbone vLLM builds
from the folder's remote code (``AutoModel``) must hold it under the same name below ``transformer.``."""

from safetensors import safe_open
from transformers import AutoConfig, AutoModel

from nanochat_hf.rl.arguments import parse_args
from nanochat_hf.rl.run import load_model

from .conftest import tiny_args


def test_named_parameters_are_the_saved_folders_names(tmp_path):
    model, tokenizer = load_model(parse_args(tiny_args(tmp_path / "out")))
    model.save_pretrained(tmp_path / "folder")
    with safe_open(str(tmp_path / "folder" / "model.safetensors"), framework="pt") as f:
        saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    sent = {name: tuple(p.shape) for name, p in model.named_parameters()}  # what TRL pushes, name by name
    assert sent == saved
    config = AutoConfig.from_pretrained(tmp_path / "folder", trust_remote_code=True)
    backbone = AutoModel.from_config(config, trust_remote_code=True)
    inner = {f"transformer.{name}" for name in backbone.state_dict()}
    assert set(sent) - inner == {"lm_head.weight"}
