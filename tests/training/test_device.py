"""The CPU thread count every command picks (`training.device.cpu_threads`): the cores idle now, read from two
/proc/stat snapshots (fixed strings here, as the kernel writes them: `cpuN user nice system idle iowait irq softirq
steal guest guest_nice`, in clock ticks of 1/100 s), and the one-line refusal of a count that cannot be."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from nanochat_hf.errors import UserError
from nanochat_hf.training import device

# the first reading: ticks since boot on 2 cores; `after` adds 0.2 s of them (20 ticks a core)
BEFORE = (
    "cpu  3000 0 1000 9000 100 0 10 0 0 0\n"
    "cpu0 1500 0 500 4500 50 0 5 0 0 0\n"
    "cpu1 1500 0 500 4500 50 0 5 0 0 0\n"
    "intr 354725 0 0\nctxt 1000\n"
)


def after(cpu0: tuple[int, ...], cpu1: tuple[int, ...]) -> str:
    """BEFORE plus these ticks (user, nice, system, idle, iowait, irq, softirq, steal) on each core."""
    base = (1500, 0, 500, 4500, 50, 0, 5, 0)
    rows = [" ".join(str(b + d) for b, d in zip(base, delta, strict=True)) for delta in (cpu0, cpu1)]
    return f"cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 {rows[0]} 0 0\ncpu1 {rows[1]} 0 0\nintr 354725 0 0\n"


IDLE = (0, 0, 0, 20, 0, 0, 0, 0)
BUSY = (17, 0, 3, 0, 0, 0, 0, 0)  # a one-core job: user and system time, no idle tick


@pytest.mark.parametrize(
    "cpu0, cpu1, own_seconds, idle, threads",
    [
        (IDLE, IDLE, 0.0, 2.0, 2),  # an idle machine (whatever the load average still says): both cores
        (BUSY, IDLE, 0.0, 1.0, 1),  # another one-core job runs: one thread, not two where one spin-waits
        (BUSY, BUSY, 0.0, 0.0, 1),  # two jobs: still one
        (BUSY, IDLE, 0.2, 2.0, 2),  # the busy core was this process's own work: not another job's
        ((0, 0, 0, 18, 2, 0, 0, 0), IDLE, 0.0, 2.0, 2),  # waiting for the disk is idle
        ((0, 0, 0, 10, 0, 0, 0, 10), IDLE, 0.0, 1.5, 2),  # half of cpu0 taken by the hypervisor (steal)
        ((9, 0, 0, 11, 0, 0, 0, 0), IDLE, 0.0, 1.55, 2),  # a job using half a core leaves one and a half
        ((14, 0, 0, 6, 0, 0, 0, 0), IDLE, 0.0, 1.3, 1),
    ],
)
def test_threads_from_two_proc_stat_snapshots(cpu0, cpu1, own_seconds, idle, threads):
    measured = device.idle_cores(BEFORE, after(cpu0, cpu1), {0, 1}, own_seconds)
    assert measured == pytest.approx(idle)
    assert device.pick_threads(2, measured) == threads


def test_only_the_cores_this_process_may_use_count():
    """Affinity {1}: cpu0's job is on a core we cannot use anyway, cpu1 is idle: one idle core of one."""
    assert device.idle_cores(BEFORE, after(BUSY, IDLE), {1}) == 1.0
    assert device.idle_cores(BEFORE, after(IDLE, BUSY), {1}) == 0.0


@pytest.mark.parametrize(
    "cores, idle, processes, threads",
    [(2, 2.0, 2, 1), (8, 8.0, 2, 4), (8, 3.0, 2, 1), (8, 5.6, 2, 3), (8, 0.0, 4, 1), (2, 2.4, 1, 2)],
)
def test_idle_cores_are_shared_among_the_processes(cores, idle, processes, threads):
    assert device.pick_threads(cores, idle, processes) == threads


def test_a_requested_count_is_used_as_is_and_says_so():
    assert device.cpu_threads(3) == (3, "3 CPU thread(s) (--num_threads 3)")
    assert device.cpu_threads(2, flag="--num-threads") == (2, "2 CPU thread(s) (--num-threads 2)")  # chat, serve


def test_the_measured_line_says_how_many_and_why(monkeypatch):
    snapshots = iter([BEFORE, after(BUSY, IDLE)])
    monkeypatch.setattr(device, "usable_cores", lambda: {0, 1})
    monkeypatch.setattr(device, "proc_stat", lambda: next(snapshots))
    assert device.cpu_threads() == (
        1,
        "1 CPU thread(s) (2 cores, 1.0 of them idle now (/proc/stat over 0.2 s); --num_threads sets it)",
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_running_one_core_job_is_seen_on_this_machine():
    """The real reading: with a busy child process on one core, at most the other cores are counted idle (other
    jobs on a shared machine can only lower it)."""
    cores = len(device.usable_cores())
    if cores < 2:
        pytest.skip("needs 2 cores")
    job = subprocess.Popen(
        [sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout.readline() == "spinning\n"
        threads, line = device.cpu_threads()
    finally:
        job.kill()
        job.wait()
    assert 1 <= threads <= cores - 1, line


@pytest.mark.parametrize("requested", [0, -1, 10_000])
def test_a_count_outside_one_to_the_cores_is_refused_in_one_line(requested):
    cores = len(device.usable_cores())
    with pytest.raises(UserError) as refused:
        device.check_num_threads(requested, f"--num_threads {requested}")
    expected = f"--num_threads {requested}: expected 1 to {cores} (the CPU cores this process may use)"
    assert str(refused.value) == expected
    device.check_num_threads(None, "--num_threads None")  # the default: measured
    device.check_num_threads(cores, f"--num_threads {cores}")


# ---- the commands: mid_train's first lines and refusal (chat, chat_eval and serve: in their own tests) ----------
def _built(argv, tiny_args, capsys, out):
    """mid_train's lines once its trainer is built (the Muon dtype and threads lines come after every check: a
    refusal prints neither), and the trainer (a one-step dry run)."""
    from nanochat_hf.training.run import build_trainer, setup

    dry = ["--num_iterations", "1", "--eval_every", "0", "--spelling_eval_rows", "0", "--dry_run", "true"]
    args, *rest = setup([*tiny_args, *dry, *argv, "--output_dir", str(out)])
    trainer = build_trainer(args, *rest)
    return capsys.readouterr().out.splitlines(), trainer


def test_the_run_says_how_many_threads_and_why_next_to_the_muon_dtype(capsys, tmp_path, tiny_args):
    cores = len(device.usable_cores())
    lines, _ = _built([], tiny_args, capsys, tmp_path / "measured")
    at = next(i for i, line in enumerate(lines) if line.startswith("mid_train: Muon orthogonalises in "))
    threads = lines[at + 1]
    count = int(threads.removeprefix("mid_train: ").split()[0])
    assert 1 <= count <= cores
    assert threads.startswith(f"mid_train: {count} CPU thread(s) ({cores} cores, "), threads
    assert threads.endswith(" of them idle now (/proc/stat over 0.2 s); --num_threads sets it)"), threads
    pinned, _ = _built(["--num_threads", "1"], tiny_args, capsys, tmp_path / "pinned")
    assert "mid_train: 1 CPU thread(s) (--num_threads 1)" in pinned


def test_the_trainer_runs_on_the_count_the_run_said(tmp_path, tiny_args, capsys):
    import torch

    threads = torch.get_num_threads()
    try:
        lines, trainer = _built([], tiny_args, capsys, tmp_path / "out")
        said = next(line for line in lines if "CPU thread(s)" in line)
        torch.set_num_threads(len(device.usable_cores()) + 1)  # a count the run cannot have said
        trainer.train()
        assert said.startswith(f"mid_train: {torch.get_num_threads()} CPU thread(s) ("), said
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("requested", ["0", "10000"])
def test_mid_train_refuses_a_count_outside_one_to_the_cores_in_one_line(requested, capsys, tmp_path):
    from nanochat_hf.training.run import main

    with pytest.raises(SystemExit) as stopped:
        main(["--num_threads", requested, "--output_dir", str(tmp_path / "out")])
    cores = len(device.usable_cores())
    assert stopped.value.code == 2 and capsys.readouterr().err == (
        f"mid_train: error: num_threads={requested}: expected 1 to {cores} (the CPU cores this process may use)\n"
    )
    assert not (tmp_path / "out").exists()


# A fresh process trains a depth-1 model on 8 x 256 tokens of a 4096-token vocabulary (its logits 32 MiB, over
# glibc's largest mmap threshold) for 11 forward/backward passes and prints the minor page faults of each of the last 7
# (the first 4 settle the heap): the kernel's own count (getrusage), not ours. The test reads the median step, the
# step a run is made of: a total over 3 steps flaked both ways, one step can differ from the others by whole 32 MiB
# blocks. With glibc's defaults a step now and then finds its blocks free in the heap (0 to 16,386 faults where most
# take 24,000-100,000), and 3 of them once summed to 49,158 (bound: over 50,000); with memory reused about one step in
# 20 still places one or two blocks anew (16,384 in 3 steps, bound: under 2 blocks). Medians of the 7 steps in 20 runs
# (10 with MALLOC_TOP_PAD_) on a 2-core AMD EPYC beside a CPU-burning process (load 6-25), 2026-11-29
# (docs/reliability.md): glibc's defaults 8,193-89,959; reused 0-1 (the mean 0-3,493); MALLOC_TOP_PAD_ set
# 116,038-116,192. The process counts in 4 KiB pages whatever the machine's transparent huge pages: it turns them off
# for itself (PR_SET_THP_DISABLE); backed by 2 MiB pages a fresh 32 MiB block is 16 faults, not 8,192 (glibc's
# defaults counted 8,225 in a quick loop).
ONE_BLOCK = 2**25 // 4096  # a 32 MiB block's 4 KiB pages
FRESH = ONE_BLOCK // 8  # a step that faults in 4 MiB or more took fresh memory from the kernel
FAULTS = """
import ctypes
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE, before anything is allocated: faults of 4 KiB pages
import resource, sys, torch
from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM
from nanochat_hf.training.device import reuse_freed_memory
print(reuse_freed_memory() if sys.argv[1] == "reuse" else False)
torch.set_num_threads(1)
model = NanoChatGPTForCausalLM(NanoChatGPTConfig.from_depth(1, vocab_size=4096, sequence_len=256))
x = torch.randint(0, 4096, (8, 256))
for step in range(11):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(input_ids=x, labels=x).loss.backward()
    if step >= 4:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict) -> tuple[str, int, int]:
    """Whether the child set glibc's malloc, and its median and mean page faults per step (of the last 7)."""
    said, *steps = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    faults = sorted(int(n) for n in steps)
    return said, faults[len(faults) // 2], sum(faults) // len(faults)


@pytest.mark.slow  # three fresh processes: ~20 s on 2 idle cores, minutes beside other jobs
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_training_steps_reuse_freed_memory_without_new_page_faults():
    """Slow because a page fault is the kernel's count for a whole process: each allocator setting needs a fresh
    process that has never trained (three, ~20 s on 2 idle cores), which no in-process test can stand in for."""
    untuned = {k: v for k, v in os.environ.items() if k not in device.MALLOC_ENV}
    assert _faults("system", untuned)[1] > FRESH  # glibc's default: fresh pages from the kernel every step
    said, median, mean = _faults("reuse", untuned)
    # reused: no fresh memory in a step, and on average less than one block placed anew
    assert said == "True" and median < FRESH and mean < ONE_BLOCK, (median, mean)
    # a malloc setting in the environment is the user's: left as it is (glibc's behaviour, faults every step)
    said, median, _ = _faults("reuse", {**untuned, "MALLOC_TOP_PAD_": "131072"})
    assert said == "False" and median > FRESH
