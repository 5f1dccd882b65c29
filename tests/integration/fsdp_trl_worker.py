"""TRL's SFTTrainer, DPOTrainer and GRPOTrainer with NanoChatOptimizerMixin on a tiny Llama, FSDP2-sharded or not,
for test_fsdp_trl.py (runs_worker.py's "fsdp_trl" runs: run(out, args)).

    args: sft|dpo|grpo [--fsdp] [--resume CHECKPOINT] [--cb PORT]    (`accelerate launch`: 2 gloo processes)

3 steps of global batch 4 at any world size, clipping at 0.1 (every step clips), float32 orthogonalisation, recipe
2025-12 (GRPO: 2026-07);
--fsdp applies `fully_shard` to each decoder layer and the root before the Trainer is built (Accelerate enables FSDP
on GPUs only); the reference models (DPO's passed whole, GRPO's built by TRL: beta 0.1, synced every step) are left
to the mixin. A checkpoint at step 2 (out/run/checkpoint-2), the final model saved with save_model
(out/final). Writes rank 0's whole parameters (params.safetensors) and, per rank, the logs, the logged losses
and grad norms and whether the reference model is sharded (rank<r>.json). --resume CHECKPOINT: resumes from it.
--cb PORT: GRPO generating by transformers' continuous batching, built in a gloo group of one process (on PORT,
unless an earlier run of the launch opened one): writes the refusal's text (refused.txt).
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from fsdp_trainer_worker import shard
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, LlamaConfig, LogitsProcessor, LogitsProcessorList
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from nanochat_hf.errors import UserError
from nanochat_hf.integration import NanoChatOptimizerMixin
from nanochat_hf.tokenizer import train_tokenizer

WORDS = "the quick brown fox jumps over the lazy dog one two three four five six seven eight nine ten".split()
COMMON = dict(report_to=[], use_cpu=True, seed=0, bf16=False, dataloader_num_workers=0, disable_tqdm=True,
              max_steps=3, logging_steps=1, save_strategy="steps", save_steps=2, max_grad_norm=0.1)  # fmt: skip


class NanoSFT(NanoChatOptimizerMixin, SFTTrainer):
    pass


class NanoDPO(NanoChatOptimizerMixin, DPOTrainer):
    pass


class NanoGRPO(NanoChatOptimizerMixin, GRPOTrainer):
    pass


def tiny_llama(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


class GroupNoise(LogitsProcessor):
    """Sampling that does not depend on the world size: Gumbel noise seeded by the row's tokens so far (padding
    left out) and its place in its GRPO group (TRL's RepeatSampler puts a group's rows next to each other on one
    rank), taken greedily. One process and two then draw the same completions, which still differ within a group."""

    def __init__(self, pad: int, eos: int, group: int):
        self.pad, self.eos, self.group = pad, eos, group

    def __call__(self, input_ids, scores):
        noise = []
        for i, row in enumerate(input_ids.tolist()):
            seed = hash((i % self.group, *(t for t in row if t != self.pad))) & 0x7FFFFFFF
            u = torch.rand(scores.shape[-1], generator=torch.Generator().manual_seed(seed))
            noise.append(-torch.log(-torch.log(u.clamp_min(1e-9))))
            if seed % 4 == 0:  # this row stops here: completions of several lengths, ranks done at different steps
                noise[-1][self.eos] = 1e4
        return scores + 3.0 * torch.stack(noise)


def build(kind, tokenizer, out, per_device, fsdp, cb=False):
    model = tiny_llama(tokenizer)
    if kind == "grpo":  # from a folder: GRPO (beta > 0) loads its reference model from the policy's name
        model.save_pretrained(out / "init")  # by the main process only
        if dist.is_initialized():
            dist.barrier()
        model = AutoModelForCausalLM.from_pretrained(out / "init")
    if fsdp:
        shard(model)
    settings = {"polar_dtype": "float32", "recipe": "2026-07" if kind == "grpo" else "2025-12"}  # both recipes
    common = dict(output_dir=str(out / "run"), per_device_train_batch_size=per_device, **COMMON)
    if kind == "sft":
        data = [[{"role": "user", "content": " ".join(WORDS[i : i + 3])},
                 {"role": "assistant", "content": " ".join(WORDS[i + 3 : i + 7])}] for i in range(12)]  # fmt: skip
        return NanoSFT(model=model, args=SFTConfig(max_length=64, **common), processing_class=tokenizer,
                       train_dataset=Dataset.from_list([{"messages": c} for c in data]),
                       nanochat_optimizer=settings)  # fmt: skip
    if kind == "dpo":
        pairs = [{"prompt": " ".join(WORDS[i : i + 3]), "chosen": " " + WORDS[i + 3], "rejected": " " + WORDS[i + 5]}
                 for i in range(12)]  # fmt: skip
        ref = tiny_llama(tokenizer, seed=1)  # another model than the policy: the reference's log-probs matter
        return NanoDPO(model=model, ref_model=ref, args=DPOConfig(max_length=32, **common), processing_class=tokenizer,
                       train_dataset=Dataset.from_list(pairs), nanochat_optimizer=settings)  # fmt: skip
    args = GRPOConfig(num_generations=2, max_completion_length=6, generation_kwargs={"do_sample": False}, beta=0.1,
                      sync_ref_model=True, ref_model_sync_steps=1,
                      use_transformers_continuous_batching=cb,
                      **common)  # fmt: skip
    noise = LogitsProcessorList([GroupNoise(tokenizer.pad_token_id, tokenizer.eos_token_id, args.num_generations)])
    generate = model.generate
    model.generate = lambda *a, **kw: generate(*a, logits_processor=noise, **kw)  # TRL passes no processors
    return NanoGRPO(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                    args=args, processing_class=tokenizer,
                    train_dataset=Dataset.from_list([{"prompt": " ".join(WORDS[i : i + 3])} for i in range(12)]),
                    nanochat_optimizer=settings)  # fmt: skip


def run(out: Path, args: list[str]) -> None:
    kind, *flags = args
    fsdp, world = "--fsdp" in flags, int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = train_tokenizer([" ".join(WORDS)] * 4, vocab_size=300)  # each run its own (a Trainer may change it)
    if "--cb" in flags:  # refused when the Trainer is built: one gloo process is enough
        if not dist.is_initialized():
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=flags[flags.index("--cb") + 1])
            dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            build(kind, tokenizer, out, 4, fsdp, cb=True)
        except UserError as e:
            (out / "refused.txt").write_text(str(e))
        return
    if world > 1:
        from transformers import TrainingArguments

        _ = TrainingArguments(output_dir=str(out / "run"), use_cpu=True, ddp_backend="gloo").device  # init gloo
    trainer = build(kind, tokenizer, out, 4 // world, fsdp)
    resume = flags[flags.index("--resume") + 1] if "--resume" in flags else None
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(out / "final"))
    rank = trainer.accelerator.process_index
    logs = [h for h in trainer.state.log_history if "loss" in h]
    report = {
        "fsdp": trainer.optimizer.optimizer.fsdp_mesh is not None,
        "world_size": trainer.optimizer.optimizer.world_size,
        "losses": [h["loss"] for h in logs],
        "grad_norms": [h["grad_norm"] for h in logs],
        "logs": logs,
        "ref_sharded": isinstance(next(trainer.ref_model.parameters()), DTensor) if kind != "sft" else None,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    model = trainer.model
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
    if rank == 0:
        save_file({n: p.contiguous() for n, p in params.items()}, str(out / "params.safetensors"))
