"""nanochat's RL stage (HEAD's scripts/chat_rl.py) on TRL's GRPOTrainer, with nanochat's optimizer.

TRL's GRPOTrainer runs the loop (generation batch, rewards, group-mean advantages with ``scale_rewards="none"``,
gradient accumulation, the linear schedule, checkpoints); what it lacks sits on its hooks:
- rollouts: ``rollout_func`` = `NanoChatRollout` (nanochat's calculator inside sampling, ``env_mask`` 0 on forced
  tokens and on the stop token);
- the reward: `rewards.gsm8k_reward` (the GSM8K task's checker), every reward function's output checked;
- the loss: `compute_loss` (public hook), nanochat's ``-sum(logp * A) / valid tokens`` of one micro-batch;
- one prompt's pass per micro-batch: `_prepare_inputs` (private hook, below);
- pass@k every ``eval_every`` steps and the per-step line: `PassAtKCallback`, `RLConsole`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from ..errors import UserError
from ..integration import NanoChatOptimizerMixin
from ..progress import Progress
from .arguments import PROG
from .rewards import checked_reward, pass_at_k
from .rollout import NanoChatRollout, render_prompt

# chat_rl.py's evaluation samples with these whatever its flags say (run_gsm8k_eval's defaults, temperature 1.0)
EVAL_SAMPLING = {"max_new_tokens": 256, "temperature": 1.0, "top_k": 50}
EVAL_SEED = 42  # Engine.generate's default seed: the same samples at every evaluation of the same weights


def trim_columns(batch: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch without the columns that are padding in every row (prompts are padded on the left to the
    generation batch's longest, completions on the right); a micro-batch is one prompt's samples, so what is left
    has no padding inside the prompt and the forward needs no attention mask, as nanochat's."""
    prompt_keep = batch["prompt_mask"].any(0)
    completion_keep = batch["completion_mask"].any(0)
    out = dict(batch)
    for key in ("prompt_ids", "prompt_mask"):
        out[key] = batch[key][:, prompt_keep]
    for key in ("completion_ids", "completion_mask", "tool_mask"):
        if key in batch:
            out[key] = batch[key][:, completion_keep]
    return out


class NanoChatGRPOTrainer(NanoChatOptimizerMixin, GRPOTrainer):
    """GRPOTrainer with nanochat's optimizer (`NanoChatOptimizerMixin`), rollouts, loss and pass@k.

    ``rollout``: the `NanoChatRollout` (given to TRL as ``rollout_func``); ``eval_rows``: the pass@k problems
    (dicts with ``prompt`` and ``answer``); ``eval_every``, ``eval_examples``: as chat_rl.py's flags.
    """

    def __init__(
        self,
        *args: Any,
        rollout: NanoChatRollout,
        reward_funcs: Any,
        eval_rows: list[dict] | None = None,
        eval_every: int = 60,
        eval_examples: int = 400,
        **kwargs: Any,
    ) -> None:
        funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        funcs = [checked_reward(f) if callable(f) and not isinstance(f, torch.nn.Module) else f for f in funcs]
        self.rollout = rollout
        self._step_started = self._sampling_at_start = 0.0
        self.step_seconds: list[float] = []
        super().__init__(*args, reward_funcs=funcs, rollout_func=rollout, **kwargs)
        if self.args.per_device_train_batch_size != rollout.device_batch_size:
            raise UserError(
                f"per_device_train_batch_size={self.args.per_device_train_batch_size} must equal the rollout's "
                f"device_batch_size={rollout.device_batch_size} (a micro-batch is one pass of one prompt)"
            )
        if self.num_generations % rollout.device_batch_size:
            raise UserError(
                f"num_samples={self.num_generations} is not a multiple of device_batch_size="
                f"{rollout.device_batch_size}: each prompt's samples are generated and trained in whole passes"
            )
        self.remove_callback(PrinterCallback)  # the log dicts: RLConsole prints nanochat's line instead
        self.add_callback(RLConsole(self))
        if eval_rows and eval_every > 0:
            self.add_callback(PassAtKCallback(self, eval_rows, eval_every, eval_examples))

    # private hook: TRL shuffles the generation batch before splitting it into micro-batches
    # (shuffle_sequence_dict), so one micro-batch would mix prompts; chat_rl.py's token mean is over one pass of
    # one prompt's samples. The generation batch arrives grouped by prompt (TRL's RepeatSampler), so the unshuffled
    # split gives exactly those passes.
    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % steps == 0 or self._buffered_inputs is None:
            self._step_started, self._sampling_at_start = time.perf_counter(), self.rollout.seconds
            batch = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = [trim_columns(b) for b in split_tensor_dict(batch, steps)]
        return self._buffered_inputs[self._step % steps]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """chat_rl.py's loss of one pass: ``-sum(logp * A) / valid tokens``, divided by the number of micro-batches
        of the step (its ``num_passes * examples_per_rank``). On-policy with ``num_iterations=1``: TRL's ratio is 1
        and its clipping inert, so nanochat's objective is computed as it is (same gradient, nanochat's value)."""
        if return_outputs:
            raise ValueError("NanoChatGRPOTrainer does not return outputs")
        completion = inputs["completion_ids"]
        ids = torch.cat([inputs["prompt_ids"], completion], dim=1)
        logits = model(input_ids=ids, logits_to_keep=completion.shape[1] + 1).logits[:, :-1]
        logp = -F.cross_entropy(logits.float().transpose(1, 2), completion, reduction="none")
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        objective = (logp * inputs["advantages"][:, None] * mask).sum() / mask.sum().clamp(min=1)
        return -objective / self.current_gradient_accumulation_steps

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._step_started:  # a training step's log: its time, split
            seconds = time.perf_counter() - self._step_started
            sampling = self.rollout.seconds - self._sampling_at_start
            self.step_seconds.append(seconds)
            logs.update(sampling_s=sampling, training_s=seconds - sampling, step_s=seconds)
        super().log(logs, start_time)


class RLConsole(TrainerCallback):
    """One line per step (rank 0): progress, reward, loss, LR multiplier, the step's sampling and training
    seconds, the ETA (mean step time of the steps after the first, times the steps left)."""

    def __init__(self, trainer: NanoChatGRPOTrainer) -> None:
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "step_s" not in logs:
            return
        step, total = state.global_step, state.max_steps
        times = self.trainer.step_seconds
        later = times[1:] or times
        eta = sum(later) / len(later) * (total - step)
        print(
            f"step {step:05d}/{total:05d} ({100 * step / total:.2f}%) | reward: {logs.get('reward', 0.0):.4f} | "
            f"loss: {logs['loss']:.6f} | lrm: {1 - (step - 1) / total:.2f} | sampling: {logs['sampling_s']:.2f}s | "
            f"training: {logs['training_s']:.2f}s | eta: {eta / 60:.1f}m",
            flush=True,
        )


class PassAtKCallback(TrainerCallback):
    """chat_rl.py's evaluation before the update of every ``eval_every``-th step (step 0 included): the first
    ``eval_examples`` problems, strided across ranks, ``device_batch_size`` samples each (`EVAL_SAMPLING`, seed
    42); pass@1..device_batch_size summed across ranks, printed as a table and logged as ``pass@k``."""

    def __init__(self, trainer: NanoChatGRPOTrainer, rows: list[dict], every: int, examples: int) -> None:
        self.trainer, self.rows, self.every, self.examples = trainer, rows[:examples], every, examples

    def evaluate(self, step: int = 0) -> dict[str, float]:
        t = self.trainer
        rollout, reward = t.rollout, t.reward_funcs[0]
        model = t.accelerator.unwrap_model(t.model)
        rank, world = t.accelerator.process_index, t.accelerator.num_processes
        prompts = [render_prompt(rollout.tokenizer, row["prompt"]) for row in self.rows[rank::world]]
        # chat_rl.py's 256 tokens, fewer where the model's context ends sooner (nanochat's rotary tables run on)
        room = rollout.max_sequence_len - max(map(len, prompts), default=0)
        sampling = {**EVAL_SAMPLING, "max_new_tokens": min(EVAL_SAMPLING["max_new_tokens"], room)}
        eval_rollout = NanoChatRollout(
            rollout.tokenizer,
            rollout.device_batch_size,
            calculator=rollout.tool is not None,
            max_sequence_len=rollout.max_sequence_len,
            **sampling,
        )
        outcomes = []
        # a long phase (400 problems x 256 tokens): rank 0 says how far its share is, the others the same pace
        with Progress(f"{PROG} pass@k at step {step}", len(prompts), "problems", t.is_world_process_zero()) as bar:
            for row, prompt in bar.wrap(zip(self.rows[rank::world], prompts)):
                completions = eval_rollout.sample(model, prompt, [EVAL_SEED])
                n = len(completions)
                scores = reward(
                    prompts=[row["prompt"]] * n,
                    completions=[None] * n,
                    completion_ids=completions,
                    answer=[row["answer"]] * n,
                )
                outcomes.append([s == 1.0 for s in scores])
        k_max = rollout.device_batch_size
        local = torch.tensor(
            [p * len(outcomes) for p in pass_at_k(outcomes, k_max)] + [len(outcomes)]
            if outcomes
            else [0.0] * (k_max + 1),
            dtype=torch.float64,
        )
        if world > 1 and dist.is_initialized():
            local = local.to(t.accelerator.device)
            dist.all_reduce(local)
        total = local[-1].item()
        return {f"pass@{k}": local[k - 1].item() / total for k in range(1, k_max + 1)}

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step % self.every:
            return
        start = time.perf_counter()
        scores = self.evaluate(state.global_step)
        if state.is_world_process_zero:
            ks = " | ".join(f"{k:>7}" for k in scores)
            values = " | ".join(f"{v:7.4f}" for v in scores.values())
            print(
                f"step {state.global_step:05d} | pass@k on {len(self.rows)} problems "
                f"({time.perf_counter() - start:.1f}s)\n| {ks} |\n| {values} |",
                flush=True,
            )
        self.trainer.log(scores)
