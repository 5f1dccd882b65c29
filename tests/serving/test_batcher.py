"""The batcher alone (no HTTP): requests admitted in one prefill (prompts of different lengths, left-padded) and
decoded together, each with its own sampling, give the tokens our generate() gives each alone, for G0, G4 and G5;
a cancelled request leaves the batch at the next step, and one still waiting holds no place in the queue; a failed
forward fails its requests and the next ones are served."""

from __future__ import annotations

import threading
import time

import pytest
from transformers import AutoTokenizer

from nanochat_hf import NanoChatGPTForCausalLM
from nanochat_hf.inference import generate_tokens
from nanochat_hf.serving.batcher import Batcher, Job, QueueFull

SETTINGS = [(0.0, None, None), (1.0, None, 7), (0.8, 5, 3), (0.0, None, None), (1.2, 40, 0)]


class Collected:
    """A sink that keeps the tokens (and stops at nothing but max_new)."""

    def __init__(self):
        self.tokens, self.finished, self.cancelled, self.done = [], False, threading.Event(), threading.Event()
        self.error = None

    def add(self, new_tokens):
        self.tokens += new_tokens

    def end(self):
        self.done.set()

    def fail(self, message, status=500):
        self.error = message
        self.done.set()


def load(folder):
    return NanoChatGPTForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("generation", ["g0", "g4", "g5"])
def test_one_prefill_then_one_batch_gives_each_request_generate_s_tokens(model_dir, generation):
    model, tokenizer = load(model_dir(generation))
    prompts = [tokenizer.encode("a prompt " * (1 + 3 * i)) for i in range(len(SETTINGS))]
    lengths = [20, 7, 26, 13, 18]  # past G4/G5's 9-key window; rows leave at different steps
    batcher = Batcher(model, tokenizer, max_batch=8, max_queue=8)
    admitted = []
    admit = batcher._admit
    batcher._admit = lambda new: (admitted.append(len(new)), admit(new))[1]
    jobs = [Job(p, n, *s, calculator=True, sink=Collected()) for p, n, s in zip(prompts, lengths, SETTINGS)]
    with batcher.cond:  # the worker takes them all at once
        for job in jobs:
            batcher.submit(job)
    for job in jobs:
        assert job.sink.done.wait(120)
    batcher.stop()
    assert admitted[0] == len(jobs)
    expected = [
        generate_tokens(model, tokenizer, [p], n, t, k, seed)[0]
        for p, n, (t, k, seed) in zip(prompts, lengths, SETTINGS)
    ]
    assert [job.sink.tokens for job in jobs] == expected


def test_sampled_rows_with_the_same_settings_each_draw_from_their_own_seed(model_dir):
    """Rows with one temperature and top_k are warped together, between greedy rows and rows of other settings:
    each still gets the tokens generate() gives its request alone (its own seed's draws, in its own row)."""
    model, tokenizer = load(model_dir("g0"))
    settings = [(0.9, None, 1), (0.0, None, None), (0.9, None, 2), (0.7, 9, 3), (0.9, None, 4), (0.7, 9, 5)]
    prompts = [tokenizer.encode("tell me " * (2 + i)) for i in range(len(settings))]
    batcher = Batcher(model, tokenizer, max_batch=8, max_queue=8)
    jobs = [Job(p, 12, *s, calculator=False, sink=Collected()) for p, s in zip(prompts, settings)]
    with batcher.cond:  # one prefill, then one batch
        for job in jobs:
            batcher.submit(job)
    for job in jobs:
        assert job.sink.done.wait(120)
    batcher.stop()
    expected = [generate_tokens(model, tokenizer, [p], 12, *s, calculator=False)[0] for p, s in zip(prompts, settings)]
    assert [job.sink.tokens for job in jobs] == expected


def test_a_cancelled_request_leaves_at_the_next_step_and_a_failure_is_contained(model_dir, capfd):
    model, tokenizer = load(model_dir("g0"))
    batcher = Batcher(model, tokenizer, max_batch=8, max_queue=1)
    prompt, other = tokenizer.encode("hello"), tokenizer.encode("a longer prompt than that one")
    stay, leave = (Job(p, 60, 0.0, None, None, True, Collected()) for p in (prompt, other))
    decode = batcher._decode

    def watched():  # the client of `leave` goes away once it has 5 tokens
        if len(leave.sink.tokens) == 5:
            leave.sink.cancelled.set()
        decode()

    batcher._decode = watched
    with batcher.cond:
        batcher.submit(stay)
        with pytest.raises(QueueFull):
            batcher.submit(leave)  # one is waiting already: the queue is full
    while not stay.sink.tokens:  # running
        time.sleep(0.01)
    batcher.submit(leave)  # joins the running batch
    assert stay.sink.done.wait(120)
    assert len(leave.sink.tokens) == 5 and not leave.sink.done.is_set()  # no token after it was cancelled
    assert stay.sink.tokens == generate_tokens(model, tokenizer, [prompt], 60)[0]

    model.forward = lambda *args, **kwargs: 1 / 0
    broken = Job(prompt, 5, 0.0, None, None, True, Collected())
    batcher.submit(broken)
    assert broken.sink.done.wait(60) and broken.sink.error == "generation failed (the server's log says why)"
    assert "ZeroDivisionError" in capfd.readouterr().err  # the reason goes to the server's log
    del model.forward
    after = Job(prompt, 5, 0.0, None, None, True, Collected())
    batcher.submit(after)
    assert after.sink.done.wait(60) and after.sink.tokens == generate_tokens(model, tokenizer, [prompt], 5)[0]
    batcher.stop()


def test_a_waiting_request_whose_client_has_gone_holds_no_place_in_the_queue(model_dir):
    model, tokenizer = load(model_dir("g0"))
    batcher = Batcher(model, tokenizer, max_batch=8, max_queue=1)
    prompt = tokenizer.encode("hello")
    gone, after = (Job(prompt, 5, 0.0, None, None, True, Collected()) for _ in range(2))
    with batcher.cond:  # the worker takes nothing meanwhile
        batcher.submit(gone)
        gone.sink.cancelled.set()
        batcher.submit(after)  # the queue of 1 holds only a request nobody waits for: this one takes its place
    assert after.sink.done.wait(60) and after.sink.tokens == generate_tokens(model, tokenizer, [prompt], 5)[0]
    assert gone.sink.tokens == []
    batcher.stop()


@pytest.mark.parametrize("generation", ["g0", "g5"])
def test_rows_that_join_a_long_request_and_leave_it_give_generate_s_tokens(model_dir, generation):
    """The batch's buffers grow: a request with a short prompt runs past the columns it started with, and requests
    with wider prompts join it later (room on the left, more rows) and leave before it (the last row moves)."""
    model, tokenizer = load(model_dir(generation))
    batcher = Batcher(model, tokenizer, max_batch=8, max_queue=8)
    long = Job(tokenizer.encode("hi"), 110, 0.0, None, None, True, Collected())
    joining = [
        Job(tokenizer.encode("a much longer prompt " * 4), 6, 0.9, None, 5, True, Collected()),
        Job(tokenizer.encode("a prompt " * 3), 30, 0.0, None, None, True, Collected()),
        Job(tokenizer.encode("another one"), 12, 1.1, 20, 2, True, Collected()),
    ]
    batcher.submit(long)
    for i, job in enumerate(joining):
        while len(long.sink.tokens) < 3 + 2 * i:  # each joins a running batch
            time.sleep(0.001)
        batcher.submit(job)
    for job in [long, *joining]:
        assert job.sink.done.wait(120)
    batcher.stop()
    for job in [long, *joining]:
        expected = generate_tokens(model, tokenizer, [job.prompt], job.max_new, job.temperature, job.top_k, job.seed)
        assert job.sink.tokens == expected[0]
