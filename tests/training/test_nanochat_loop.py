"""Acceptance: a whole short epoch of `mid_train` logs what nanochat's mid-training loop logs.

The reference below is nanochat's loop written plainly from its documented behaviour (docs/): one token stream
per rank fed by a conversation cursor that wraps around (and, for the train split, flags the last step when it
does), a prefetched first micro-batch and the next one drawn after each backward, progress = max(progress,
cursor / size), LR multiplier 1 until progress 0.8 then linear to 0, Muon momentum 0.85 -> 0.95 over 300
steps, a debiased EMA of the last micro-batch's loss, and validation over a fresh generator (wrapping too)
at step 0, every eval_every steps and at the last step. Same initial weights, same conversations, the
project's optimizer on both sides; fp32 on CPU.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.slow

B, T, TOTAL, EVAL_EVERY, EVAL_TOKENS = 2, 32, 128, 10, 2048  # grad accumulation 2; eval wraps the val set

MIXTURE = """
train:
  seed: 7
  tasks:
    - {task: simple_spelling, split: train, size: 100, words: demo}
    - {task: arithmetic, split: train, size: 30}
val:
  seed: 7
  tasks:
    - {task: simple_spelling, split: test, size: 6, words: demo}
"""


def reference_nanochat(model, train_convs, val_convs, token_bytes):
    from nanochat_hf.optim import build_optimizer

    grad_accum = TOTAL // (B * T)
    flags = {"last_step": False, "approx_progress": 0.0}

    def generator(convs, train):
        size, needed, buf, cursor = len(convs), B * T + 1, [], 0
        while True:
            while len(buf) < needed:
                buf.extend(convs[cursor])
                cursor += 1
                if cursor >= size:
                    cursor -= size
                    if train:
                        flags["last_step"] = True
            chunk = torch.tensor(buf[:needed])
            del buf[:needed]
            if train:
                flags["approx_progress"] = cursor / size
            yield chunk[:-1].view(B, T), chunk[1:].view(B, T)

    def loss_of(x, y, reduction="mean"):
        logits = model(input_ids=x).logits.float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), reduction=reduction)

    @torch.no_grad()
    def val_bpb():
        val = generator(val_convs, train=False)
        nats, nbytes = 0.0, 0
        for _ in range(EVAL_TOKENS // (B * T)):
            x, y = next(val)
            losses = loss_of(x, y, "none")
            nb = token_bytes[y.reshape(-1)]
            nats += (losses * (nb > 0)).sum().item()
            nbytes += nb.sum().item()
        return nats / (math.log(2) * nbytes)

    opt = build_optimizer(model)
    train = generator(train_convs, train=True)
    x, y = next(train)
    step, progress, smooth = 0, 0.0, 0.0
    losses, lrms, bpbs = [], [], {}
    while True:
        last = flags["last_step"]
        if last or step % EVAL_EVERY == 0:
            model.eval()
            bpbs[step] = val_bpb()
            model.train()
        if last:
            break
        for _ in range(grad_accum):
            loss = loss_of(x, y)
            train_loss = loss.item()
            (loss / grad_accum).backward()
            x, y = next(train)
            progress = max(progress, flags["approx_progress"])
        lrm = 1.0 if progress < 0.8 else 1.0 - (progress - 0.8) / 0.2
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        frac = min(step / 300, 1.0)
        opt.set_muon_momentum((1 - frac) * 0.85 + frac * 0.95)
        opt.step()
        model.zero_grad(set_to_none=True)
        step += 1
        smooth = 0.9 * smooth + 0.1 * train_loss
        losses.append(smooth / (1 - 0.9 ** (step + 1)))
        lrms.append(lrm)
    return losses, lrms, bpbs


def test_epoch_matches_nanochat_loop(tmp_path):
    from transformers import AutoModelForCausalLM

    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
    from nanochat_hf.data import demo_tokenizer, load_mixture, tokenize_conversations
    from nanochat_hf.tokenizer import token_bytes
    from nanochat_hf.training.run import main

    tok = demo_tokenizer()
    torch.manual_seed(0)
    start = tmp_path / "start"
    NanoChatGPTForCausalLM(
        NanoChatGPTConfig(vocab_size=len(tok), n_layer=2, n_head=1, n_kv_head=1, n_embd=64, sequence_len=T)
    ).save_pretrained(start)
    tok.save_pretrained(start)
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(MIXTURE)
    out = tmp_path / "out"
    main(
        [
            "--model_source",
            str(start),
            "--train_mixture",
            str(mixture),
            "--val_mixture",
            str(mixture),
            "--max_seq_len",
            str(T),
            "--device_batch_size",
            str(B),
            "--total_batch_size",
            str(TOTAL),
            "--eval_every",
            str(EVAL_EVERY),
            "--eval_tokens",
            str(EVAL_TOKENS),
            "--spelling_eval_rows",
            "0",
            "--dtype",
            "float32",
            "--disable_tqdm",
            "true",
            "--output_dir",
            str(out),
        ]
    )
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    ours_loss = [h["loss"] for h in history if "lrm" in h]
    ours_lrm = [h["lrm"] for h in history if "lrm" in h]
    ours_bpb = {h["step"]: h["eval_val_bpb"] for h in history if "eval_val_bpb" in h}

    def rendered(split):
        ds = tokenize_conversations(load_mixture(str(mixture), split=split), tok, max_tokens=2048)
        return [list(ids) for ids in ds["input_ids"]]

    model = AutoModelForCausalLM.from_pretrained(start)
    model.train()
    ref_loss, ref_lrm, ref_bpb = reference_nanochat(model, rendered("train"), rendered("val"), token_bytes(tok))

    assert len(ref_loss) > EVAL_EVERY * 2 and min(ref_lrm) < 0.5  # a whole epoch, through the LR decay
    assert len(ours_loss) == len(ref_loss), "steps in the epoch"
    assert ours_lrm == pytest.approx(ref_lrm, abs=1e-12)
    assert ours_loss == pytest.approx(ref_loss, rel=1e-3)
    assert sorted(ours_bpb) == sorted(ref_bpb) and len(ref_bpb) >= 3  # step 0, mid-run, last step
    assert [ours_bpb[s] for s in sorted(ours_bpb)] == pytest.approx([ref_bpb[s] for s in sorted(ref_bpb)], rel=1e-3)
