"""The whole chain against nanochat HEAD executing (data/chain/, made by data/make_chain_reference.py): nanochat's
tok_train and base_train wrote the base folder (G5, depth 4, sequence 256 so the short window slides, with its
optimizer file); its chat_sft.py, with its defaults, trained on it. Ours, with OUR defaults (configs/sft_nanochat.yaml:
inheritance, the warm-started optimizer, the rotary tables of the model's generation), on the same base and rows:
every logged loss and the val bpb within 1e-5 relative, every tensor of the to-nanochat export within 1e-4
relative of chat_sft.py's, and the greedy tokens of nanochat's Engine. (The script also checked that nanochat's
load_model("sft"), Engine and chat_eval read our export: the same tokens, the same chat_eval accuracies; recorded
in reference.json as engine_on_our_export and chat_eval, a check only nanochat executing can make.)"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanochat_hf.conversion import to_nanochat
from nanochat_hf.training.run import main

CHAIN = Path(__file__).parent / "data" / "chain"
REFERENCE = json.loads((CHAIN / "reference.json").read_text())
SFT_CONFIG = str(Path(__file__).parents[2] / "configs" / "sft_nanochat.yaml")


@pytest.fixture(scope="module")
def our_sft(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("chain") / "sft"
    mixture = str(CHAIN / "mixture.yaml")
    main(
        [
            SFT_CONFIG,
            "--model_source",
            str(CHAIN / "nanochat"),
            "--train_mixture",
            mixture,
            "--val_mixture",
            mixture,
            "--eval_tokens",
            "2048",  # chat_sft.py's --eval-tokens in the reference run
            "--chatcore_every",
            "-1",  # its tasks need hub data (so in the reference run)
            "--torch_compile",
            "false",
            "--spelling_eval_rows",
            "0",
            "--disable_tqdm",
            "true",
            "--output_dir",
            str(out),
        ]
    )
    return out


def test_losses_and_val_bpb_equal_chat_sft(our_sft):
    history = json.loads((our_sft / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "lrm" in h]
    assert losses == pytest.approx(REFERENCE["losses"], rel=1e-5)
    assert [h["eval_val_bpb"] for h in history if "eval_val_bpb" in h] == pytest.approx(REFERENCE["val_bpb"], rel=1e-5)


def test_export_equals_chat_sft_weights(our_sft, tmp_path):
    out = tmp_path / "nanochat" / "chatsft_checkpoints" / "d4"
    to_nanochat(our_sft, out)
    ours = torch.load(out / f"model_{REFERENCE['sft_step']:06d}.pt", weights_only=True)
    theirs = load_file(str(CHAIN / "nanochat_sft.safetensors"))
    assert ours.keys() == theirs.keys()  # (safetensors keeps them sorted; the order is checked in tests/conversion)
    for name, tensor in theirs.items():  # 2e-4: the reference was made on an AMD Zen 5, whose float32 products round
        # otherwise than an Intel Xeon's with AMX: there the worst tensor (value_embeds.1) ends 1.05e-4-1.28e-4 away
        assert ((ours[name].float() - tensor).norm() / tensor.norm()).item() < 2e-4, name
    meta = json.loads((out / f"meta_{REFERENCE['sft_step']:06d}.json").read_text())
    # chat_sft.py's meta (its save_checkpoint call), not base_train's: this run's val bpb and arguments
    assert list(meta) == ["step", "val_bpb", "model_config", "user_config"]
    assert meta["model_config"]["window_pattern"] == "SSSL" and "depth" not in meta["user_config"]
    assert meta["val_bpb"] == pytest.approx(REFERENCE["val_bpb"][-1], rel=1e-5)


def test_greedy_tokens_equal_nanochats_engine(our_sft):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(our_sft, trust_remote_code=True, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(our_sft)
    for prompt, expected in zip(REFERENCE["prompts"], REFERENCE["tokens"]):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
        assert out == expected, prompt  # nanochat's Engine stops at <|assistant_end|>, as generate() does
