"""The optimizer-state file round-trips exactly (safetensors + JSON, no pickles)."""

import torch

from nanochat_hf.integration.optimizer_state import load_optimizer_state, save_optimizer_state


def test_optimizer_state_roundtrip(tmp_path):
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.optim import build_optimizer

    model = NanoChatGPTForCausalLM(NanoChatGPTConfig(vocab_size=64, n_layer=1, n_head=1, n_kv_head=1, n_embd=64))
    opt = build_optimizer(model)
    model(input_ids=torch.randint(0, 64, (2, 9)), labels=torch.randint(0, 64, (2, 9))).loss.backward()
    opt.step()
    sd = opt.state_dict()
    save_optimizer_state(opt, tmp_path / "o.safetensors")
    back = load_optimizer_state(tmp_path / "o.safetensors")
    assert back["param_groups"] == sd["param_groups"]
    assert {k: v for k, v in back.items() if k not in ("state", "param_groups", "recipe")} == {
        k: v for k, v in sd.items() if k not in ("state", "param_groups")
    }
    for pid, st in sd["state"].items():
        for key, value in st.items():
            got = back["state"][pid][key]
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value
    opt2 = build_optimizer(model)
    opt2.load_state_dict(back)
    assert back["recipe"] == "2025-12"
