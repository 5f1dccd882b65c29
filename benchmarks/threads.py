"""The demo's step time and greedy generation with the default CPU thread count, 1 thread and all cores forced, while
other jobs run or have just stopped (issue 40).

    python benchmarks/threads.py                   # cases a, b, c: 3 to 6 minutes on 2 cores
    python benchmarks/threads.py --cases now       # the machine as it is, nothing started or stopped

Cases (one-core job: a Python busy loop in another process, started here):
  b  while another one-core job runs;
  a  right after that job ended (run straight after b; without b, after a job of --prior_s seconds): the machine is
     idle but the 1-minute load average still reads about 1;
  c  while two one-core jobs run;
  now  the machine as it is.
In each case the default is what every command picks (`nanochat_hf.training.device.cpu_threads`, measured once at
the case's start, as a run measures once when it starts); the count the old rule (cores minus the 1-minute load
average) would pick is shown beside it. Work: one demo optimizer step, eager (the demo model: depth 4, vocab 4096,
fp32; 2 micro-batches of 8 x 256 tokens, forward, backward, Muon/AdamW), and greedy generation of --new_tokens at
batch 1 with the KV cache. The arms alternate within each repeat (a change in load hits all alike), after one
untimed warm-up of each before any case; the table shows the median repeat. A case stops after --repeats, or after
the repeat that passes --budget_s (on busy cores 2 threads can take a minute a step). "others" is the CPU that
processes other than this one and its jobs used during the case, in cores (/proc/stat): on a shared machine it is
not 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from transformers import GenerationConfig

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.data.demo import DEMO_VOCAB_SIZE
from nanochat_hf.optim import build_optimizer
from nanochat_hf.training.device import cpu_threads, idle_cores, pick_threads, proc_stat, usable_cores

JOBS = {"a": 0, "b": 1, "c": 2, "now": 0}  # one-core jobs running during each case
RUN_ORDER = ("b", "a", "c", "now")  # a straight after b: b's job has just ended
# a one-core job that ends with the benchmark, however that ends (its parent gone, it is re-parented)
SPIN = "import os\nparent = os.getppid()\nprint('spinning', flush=True)\nwhile os.getppid() == parent: pass"
TICKS = os.sysconf("SC_CLK_TCK")


def demo_model(depth: int, vocab: int, seed: int = 0) -> NanoChatGPTForCausalLM:
    """The demo's model shape with random weights everywhere (a fresh model's zero projections would make every
    greedy token the same)."""
    config = NanoChatGPTConfig.from_depth(
        depth, vocab_size=vocab, sequence_len=512, bos_token_id=0, eos_token_id=0, pad_token_id=1
    )
    model = NanoChatGPTForCausalLM(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "wte" in name else p.shape[1] ** -0.5))
    return model


def generate(model, new_tokens: int, vocab: int) -> None:
    ids = torch.randint(2, vocab, (1, 24), generator=torch.Generator().manual_seed(1))
    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=1, eos_token_id=0
    )
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)


def demo_step(model, optimizer, batches: list[torch.Tensor]) -> None:
    """One optimizer step over the micro-batches (gradient accumulation), as the demo's eager step."""
    for ids in batches:
        (model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss / len(batches)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def start_jobs(count: int) -> list[subprocess.Popen]:
    jobs = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    for job in jobs:
        job.stdout.readline()  # it spins from here on
    return jobs


def job_seconds(job: subprocess.Popen) -> float:
    """CPU seconds a running job has used (utime + stime of /proc/<pid>/stat)."""
    with open(f"/proc/{job.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def stop_jobs(jobs: list[subprocess.Popen]) -> float:
    """Stop the jobs; the CPU seconds they used."""
    used = sum(job_seconds(job) for job in jobs)
    for job in jobs:
        job.kill()
        job.wait()
    return used


def run_case(name: str, works: dict, forced: dict, repeats: int, budget_s: float, cpus: set[int]) -> dict:
    """Time every work at every arm's thread count while the case's jobs run, `repeats` times or until a repeat ends
    past `budget_s`; the case's default, the old rule's pick, and the CPU others used (in cores)."""
    jobs = start_jobs(JOBS[name])
    try:
        load = os.getloadavg()[0]
        default, _ = cpu_threads()
        old_rule = pick_threads(len(cpus), len(cpus) - load)
        arms = {"default": default, **forced}
        before, own, t0 = proc_stat(), time.process_time(), time.perf_counter()
        times = {(work, arm): [] for work in works for arm in arms}
        for repeat in range(1, repeats + 1):
            for work, run in works.items():
                for arm, threads in arms.items():
                    torch.set_num_threads(threads)
                    start = time.perf_counter()
                    run()
                    times[work, arm].append(time.perf_counter() - start)
            if time.perf_counter() - t0 > budget_s:
                break
        ours = time.process_time() - own + sum(job_seconds(job) for job in jobs)
        elapsed = time.perf_counter() - t0
        others = len(cpus) - idle_cores(before, proc_stat(), cpus, ours, TICKS)
    finally:
        stop_jobs(jobs)
    return {
        "case": name,
        "load": load,
        "default": default,
        "old_rule": old_rule,
        "others": others,
        "seconds": elapsed,
        "repeats": repeat,
        "times": {key: statistics.median(values) for key, values in times.items()},
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="a,b,c", help="comma list of a, b, c, now (run in the order b, a, c, now)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget_s", type=float, default=60.0, help="a case stops after the repeat that passes this")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--vocab", type=int, default=DEMO_VOCAB_SIZE)
    p.add_argument("--rows", type=int, default=8, help="rows of --seq tokens per micro-batch")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro_batches", type=int, default=2, help="micro-batches per step (the demo: 4096 tokens)")
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--prior_s", type=float, default=30.0, help="case a without b: the one-core job it follows")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := set(cases) - set(JOBS):
        p.error(f"--cases: unknown {', '.join(sorted(unknown))}; expected a comma list of a, b, c, now")
    cpus = usable_cores()
    cores = len(cpus)
    infer = demo_model(args.depth, args.vocab).eval()
    train = demo_model(args.depth, args.vocab).train()
    optimizer = build_optimizer(
        train, matrix_lr=0.02, embedding_lr=0.2, unembedding_lr=0.004, weight_decay=0.0, init_lr_frac=1.0
    )
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(2, args.vocab, (args.rows, args.seq + 1), generator=g) for _ in range(args.micro_batches)]
    works = {
        f"demo step ({args.micro_batches} x {args.rows} x {args.seq} tokens)": lambda: demo_step(
            train, optimizer, batches
        ),
        f"generate {args.new_tokens} tokens": lambda: generate(infer, args.new_tokens, args.vocab),
    }
    forced = {"1 thread": 1, f"{cores} threads": cores} if cores > 1 else {"1 thread": 1}
    for threads in forced.values():  # warm-up: first calls allocate and pick kernels
        torch.set_num_threads(threads)
        for run in works.values():
            run()

    results = []
    for name in (c for c in RUN_ORDER if c in cases):
        if name == "a" and "b" not in cases:  # the one-core job that case a follows
            jobs = start_jobs(1)
            time.sleep(args.prior_s)
            stop_jobs(jobs)
        results.append(run_case(name, works, forced, args.repeats, args.budget_s, cpus))
        print(f"case {name}: {results[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)  # progress

    print(
        f"{cores} cores ({os.uname().machine}), torch {torch.__version__}; seconds per call, median of the case's "
        "repeats; others: CPU used by other processes during the case, in cores; load: 1-minute load average at "
        "the case's start\n"
    )
    arms = ["default", *forced]
    head = ["case", "repeats", "others", "load", "default (old rule)", "work", *arms, "default / best forced"]
    print(f"| {' | '.join(head)} |")
    print(f"|{'---|' * len(head)}")
    rows = []
    for r in sorted(results, key=lambda r: cases.index(r["case"])):
        for work in works:
            seconds = {arm: r["times"][work, arm] for arm in arms}
            ratio = seconds["default"] / min(seconds[arm] for arm in forced)
            cells = " | ".join(f"{seconds[arm]:.2f}" for arm in arms)
            print(
                f"| {r['case']} | {r['repeats']} | {r['others']:.1f} | {r['load']:.1f} | {r['default']} "
                f"({r['old_rule']}) | {work} | {cells} | {ratio:.2f}{'' if ratio <= 1.1 else ' (over 1.10)'} |"
            )
            fields = ("case", "repeats", "others", "load", "default", "old_rule")
            rows.append({**{k: r[k] for k in fields}, "work": work, "seconds": seconds, "ratio": ratio})
    print(f"\n{sum(r['seconds'] for r in results):.0f} s of cases")
    return rows


if __name__ == "__main__":
    main()
