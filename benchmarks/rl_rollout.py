"""Rollout tokens/s: our RL sampler (`NanoChatRollout.sample`: generate() with the calculator) vs nanochat HEAD's
`Engine.generate_batch` (what chat_rl.py samples with), on the same model, prompts, sampling settings and threads.

    git -C <nanochat.git> archive 92d63d4 | tar -x -C /tmp/nc && pip install --target /tmp/ncdeps rustbpe
    OMP_NUM_THREADS=1 python benchmarks/rl_rollout.py --nanochat /tmp/nc --deps /tmp/ncdeps

The model: a nanochat base dir's chatsft_checkpoints (default: the tests' tiny G5 model, tests/rl/data/nanochat),
loaded by nanochat's load_model in float32 and by ours (converted on the fly). Per GSM8K-layout prompt,
``--samples`` completions in passes of ``--device_batch_size`` (temperature 1.0, top-k 50, ``--max_new_tokens``),
each pass seeded as chat_rl.py seeds it: HEAD calls generate_batch once per pass, as chat_rl.py does; ours samples
a prompt's passes in one batch. Tokens counted are the completions' (forced calculator tokens and the stop token
included, the prompt not).
The two samplers alternate within each repeat (a change in load hits both alike); the table shows each repeat's
ratio, then their median and best.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanochat", required=True, help="a nanochat HEAD source tree (git archive 92d63d4)")
    p.add_argument("--deps", default=None, help="folder with rustbpe (pip install --target)")
    p.add_argument("--base_dir", default=str(REPO / "tests" / "rl" / "data" / "nanochat"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=16, help="samples per prompt (chat_rl.py's num_samples)")
    p.add_argument("--device_batch_size", type=int, default=8, help="samples per pass (HEAD: one call per pass)")
    p.add_argument("--max_new_tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    os.environ.update(NANOCHAT_BASE_DIR=a.base_dir, NANOCHAT_DTYPE="float32", TORCHDYNAMO_DISABLE="1")
    sys.path[:0] = [a.nanochat] + ([a.deps] if a.deps else [])
    import torch
    from nanochat.checkpoint_manager import load_model as nanochat_load
    from nanochat.engine import Engine

    from nanochat_hf.rl.arguments import parse_args
    from nanochat_hf.rl.rollout import NanoChatRollout
    from nanochat_hf.rl.run import gsm8k_rows, load_model

    head_model, head_tok, _ = nanochat_load("sft", torch.device("cpu"), phase="eval")
    engine = Engine(head_model, head_tok)
    args = parse_args(["--model_source", a.base_dir, "--trust_pickle", "true", "--gsm8k_source", "demo"])
    args.eval_examples = a.prompts
    model, tok = load_model(args)
    model = model.float().eval()
    rollout = NanoChatRollout(tok, a.device_batch_size, a.max_new_tokens, 1.0, 50, True, model.config.sequence_len)
    passes = a.samples // a.device_batch_size
    seeds = [[hash((0, i, p)) & 0x7FFFFFFF for p in range(passes)] for i in range(a.prompts)]  # chat_rl.py's
    rows = gsm8k_rows(args, "test")
    prompts = [rollout.prompt_ids(r["prompt"]) for r in rows]
    head_prompts = [
        head_tok.render_for_completion({"messages": [*r["prompt"], {"role": "assistant", "content": ""}]}) for r in rows
    ]
    assert prompts == head_prompts, "the two renderers disagree"

    def ours() -> int:
        return sum(len(c) for i, t in enumerate(prompts) for c in rollout.sample(model, t, seeds[i]))

    def head() -> int:
        n = 0
        for i, t in enumerate(prompts):
            for seed in seeds[i]:
                kw = dict(num_samples=a.device_batch_size, max_tokens=a.max_new_tokens, temperature=1.0, top_k=50)
                sequences, _ = engine.generate_batch(t, seed=seed, **kw)
                n += sum(len(s) - len(t) + (len(s) - len(t) < a.max_new_tokens) for s in sequences)  # + its stop
        return n

    def timed(fn) -> float:
        start = time.perf_counter()
        tokens = fn()
        return tokens / (time.perf_counter() - start)

    ours(), head()  # warm-up
    setting = (
        f"{a.prompts} prompts x {a.samples} samples (passes of {a.device_batch_size}), <= {a.max_new_tokens} tokens"
    )
    print(f"threads {torch.get_num_threads()}, {setting}, load {os.getloadavg()[0]:.1f}")
    print("| repeat | ours tok/s | HEAD Engine tok/s | ratio |\n|---|---|---|---|")
    ratios = []
    for r in range(a.repeats):
        o, h = timed(ours), timed(head)
        ratios.append(o / h)
        print(f"| {r} | {o:,.0f} | {h:,.0f} | {o / h:.2f}x |")
    print(f"ratio ours / HEAD: median {statistics.median(ratios):.2f}x, best {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
