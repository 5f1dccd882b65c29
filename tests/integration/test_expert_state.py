"""MoE expert stacks in Muon keep their optimizer state through a checkpoint: each stack's momentum (and, in recipe
2026-07, NorMuon's second moment) is written by name and read back bit for bit, in both recipes. (The 2-process
reshard tests route experts to AdamW; this is the Muon route, whose state is per stack, not per group.)"""

import pytest
import torch

from nanochat_hf.integration.optimizer_state import OPTIMIZER_FILE, load_optimizer_state, save_optimizer_state
from nanochat_hf.optim import build_optimizer


@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_expert_stacks_state_round_trips(state_worker, tmp_path, recipe):
    model = state_worker.helpers.tiny_hf("mixtral")
    opt = build_optimizer(model, recipe=recipe, polar_dtype="float32")
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 9), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    save_optimizer_state(opt, model, tmp_path / OPTIMIZER_FILE.format(rank=0))
    again = build_optimizer(model, recipe=recipe, polar_dtype="float32")
    load_optimizer_state(again, model, tmp_path)
    names = {id(p): n for n, p in model.named_parameters()}
    stacks = [p for p in model.parameters() if p.ndim == 3]
    assert stacks and all(p in opt.state for p in stacks)
    for p, st in opt.state.items():
        for key, value in st.items():
            if torch.is_tensor(value):
                assert torch.equal(again.state[p][key], value), (names[id(p)], key)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "olmoe"])
def test_an_moe_model_resumes_through_a_trainer(state_worker, tmp_path, arch):
    """Issue 52: save_pretrained writes an MoE's fused expert stacks expert by expert, and the resume refused the
    checkpoint (missing experts.gate_up_proj, unexpected experts.0.*). Resumed at step 2 of 4 (the checkpoint's
    experts read as from_pretrained reads them), the run logs the uninterrupted run's losses and ends with its
    weights, bit for bit. (The 2-process FSDP2 load: test_fsdp2_save.py; ZeRO-2 loads as one process does.)
    slow: a Trainer run of 4 steps, then 2 resumed, per architecture (seconds)."""
    from datasets import Dataset
    from safetensors import safe_open
    from transformers import Trainer, TrainingArguments

    from nanochat_hf.integration import NanoChatOptimizerMixin

    class MoETrainer(NanoChatOptimizerMixin, Trainer):
        pass

    g = torch.Generator().manual_seed(1)
    data = Dataset.from_list(
        [{"input_ids": r, "labels": r} for r in torch.randint(0, 128, (8, 8), generator=g).tolist()]
    )

    def run(resume=None):
        model = state_worker.helpers.tiny_hf(arch)
        args = TrainingArguments(
            output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, save_steps=2, logging_steps=1,
            report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = MoETrainer(model=model, args=args, train_dataset=data, nanochat_optimizer={"polar_dtype": "float32"})
        trainer.train(resume_from_checkpoint=resume)
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], model.state_dict()

    losses, weights = run()
    with safe_open(tmp_path / "checkpoint-2" / "model.safetensors", framework="pt") as f:
        assert any(".experts.0." in name for name in f.keys())  # one by one, where the model's are fused
    resumed_losses, resumed = run(resume=str(tmp_path / "checkpoint-2"))
    assert resumed_losses == losses and len(losses) == 4
    assert weights.keys() == resumed.keys() and all(torch.equal(resumed[k], weights[k]) for k in weights)
