"""The batcher in a process of its own (``--engine process``, the default), as vLLM's engine core: the model, its
cache and the token choice in a child process; HTTP, tokenization and the reply text in the server's.

Why: in one process the batcher's thread and the event loop take turns on one GIL: with 8 streaming clients the
batcher's thread waited for it 8% of every decoding step, and in a process of its own the same batcher
served a few percent more tokens per second (G0 1.04x over 10 interleaved rounds, G5 1.08x; docs/serving.md). Only
requests and tokens cross: a request in, once; each step's new tokens out, in one message for all rows.

``EngineProcess`` has the ``Batcher``'s interface (``submit``, ``stop``, ``alive``, ``max_queue``): the server's
sinks stay in the server. The child's stand-in for a sink (``_Relay``) collects its row's tokens, sent once a step;
the server's side hands them to the real sink, and tells the child to drop a row once its sink wants no more: at
once when its client goes (the sink's ``cancelled`` tells the child as it is set, so the row is dropped before the
child's next step, as in one process), after the step's message when its text reached a stop string.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.connection
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from ..errors import UserError
from ..model import NanoChatGPTForCausalLM
from ..tokenizer.chat_format import STOP_TOKENS, special_token_ids
from .batcher import Batcher, Job, QueueFull, ShuttingDown, Sink
from .cli import exit_now

REQUEST = ("prompt", "max_new", "temperature", "top_k", "seed", "calculator")  # what of a Job the child is sent
GONE = "the model's process has exited (the server's log says why)"
START_SECONDS = 600  # the child imports torch and loads the weights: minutes at most, on any disk


def load_model(path: Path, dtype: str, device: str) -> NanoChatGPTForCausalLM:
    """The served model, in evaluation mode, from a directory ``save_pretrained`` wrote."""
    return NanoChatGPTForCausalLM.from_pretrained(path, dtype=dtype, device_map=device).eval()


class EngineProcess:
    """``Batcher(model, tokenizer, max_batch, max_queue)`` run in a child process that loads the model itself."""

    def __init__(self, path: Path, dtype: str, device: str, threads: int, max_batch: int, max_queue: int):
        self.max_batch, self.max_queue = max_batch, max_queue
        self.sinks: dict[int, Sink] = {}  # the requests in the child, waiting or running
        self.ids = itertools.count()
        self.lock = threading.Lock()  # the event loop's submits and the reader's cancels both send
        self.stopping = False
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked threads, CUDA can start
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=_child,
            args=(theirs, str(path), dtype, device, threads, max_batch, max_queue),
            name="nanochat-engine",
            daemon=True,  # never outlives the server
        )
        self.process.start()
        theirs.close()
        if not self.conn.poll(START_SECONDS):
            self.process.kill()
            raise UserError(f"{path}: the model's process did not start within {START_SECONDS} s")
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join()
            raise UserError(f"{path}: the model's process exited while loading (exit code {self.process.exitcode})")
        if message[0] == "error":
            self.process.join()
            raise UserError(f"{path}: could not load the model: {message[1]}")
        self.reader = threading.Thread(target=self._read, name="nanochat-engine-reader", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        """The model's process runs and its replies are read. Its exit is seen here at once (the process's sentinel),
        not only once the reader has read the end of the pipe: /health and a chat give the same answer."""
        return self.reader.is_alive() and not multiprocessing.connection.wait([self.process.sentinel], 0)

    def submit(self, job: Job) -> None:
        fields = {name: getattr(job, name) for name in REQUEST}
        with self.lock:
            if self.stopping:
                raise ShuttingDown
            if not self.alive():
                raise ShuttingDown(GONE)
            # the child's own queue is never the one that is full: it takes this many (see _child)
            if len(self.sinks) >= self.max_batch + self.max_queue:
                raise QueueFull
            index = next(self.ids)
            self.sinks[index] = job.sink  # before it is sent: the reader may hand on its first tokens at once
            try:
                self.conn.send(("submit", index, fields))
            except OSError:  # it died since alive() was asked
                del self.sinks[index]
                raise ShuttingDown(GONE) from None
        if job.sink.cancelled.is_set():  # gone already
            self._drop([index])
        else:  # the server sets it when the client goes: the child hears at once
            job.sink.cancelled = _Told(lambda: self._drop([index]))

    def stop(self, timeout: float = 5.0) -> None:
        """Fail what is waiting and running (``the server is shutting down``) and end the child."""
        with self.lock:
            self.stopping = True
            sinks, self.sinks = list(self.sinks.values()), {}
            try:
                self.conn.send(("stop", None))
            except OSError:  # the child has gone already
                pass
        for sink in sinks:
            sink.fail("the server is shutting down", 503)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
        self.reader.join(timeout)  # it reads the end of the child's output
        self.conn.close()

    def _drop(self, indices: list[int]) -> None:
        """These requests need no more tokens: the child drops their rows before its next step."""
        with self.lock:
            for index in indices:
                if self.sinks.pop(index, None) is not None and not self.stopping:
                    try:
                        self.conn.send(("cancel", index))
                    except OSError:  # the child has gone: nothing to drop
                        pass

    def _read(self) -> None:
        """Each message: one step's events for the rows, handed to their sinks; then the rows whose sinks want no
        more (a stop string) are dropped from the child."""
        while True:
            try:
                events = self.conn.recv()
            except (EOFError, OSError):  # the child has gone: stopped, or died
                break
            done = []  # requests whose text reached a stop string, or that cannot be written
            for index, kind, value in events:  # a request dropped already (the event loop drops too) is skipped
                sink = self.sinks.get(index) if kind == "add" else self.sinks.pop(index, None)
                if sink is None:
                    continue
                try:
                    if kind == "add":
                        sink.add(value)
                        if sink.finished:
                            done.append(index)
                    elif kind == "end":
                        sink.end()
                    else:
                        sink.fail(*value)
                except Exception:  # a reply that cannot be written ends that request only (the reason to the log)
                    traceback.print_exc(file=sys.stderr)
                    done.append(index)
            self._drop(done)
        with self.lock:
            sinks, self.sinks = list(self.sinks.values()), {}
            if not self.stopping:  # killed, out of memory: what it held fails, and so does every request after
                self.process.join(5)
                print(f"serve: the model's process exited (exit code {self.process.exitcode})", file=sys.stderr)
        for sink in sinks:
            sink.fail(GONE)


class _Told(threading.Event):
    """A sink's ``cancelled`` that, once set, also tells the child (``tell``)."""

    def __init__(self, tell: Callable[[], None]):
        super().__init__()
        self.tell = tell

    def set(self) -> None:
        super().set()
        self.tell()


class _Relay:
    """A row's sink in the child: its events wait in ``outbox`` for the end of the step."""

    def __init__(self, index: int, outbox: list, stops: set[int]):
        self.index, self.outbox, self.stops = index, outbox, stops
        self.finished = False
        self.cancelled = threading.Event()

    def add(self, new_tokens: list[int]) -> None:
        self.outbox.append((self.index, "add", new_tokens))
        self.finished = new_tokens[-1] in self.stops  # the server's sink ends there too: no step more for it

    def end(self) -> None:
        self.outbox.append((self.index, "end", None))
        self.finished = True

    def fail(self, message: str, status: int = 500) -> None:
        self.outbox.append((self.index, "fail", (message, status)))
        self.finished = True


def _child(conn, path: str, dtype: str, device: str, threads: int, max_batch: int, max_queue: int) -> None:
    """The child: load the model, say so, then take requests and cancels until the server says stop (or goes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server stops us
    torch.set_num_threads(threads)
    # transformers' loading bar would make tqdm's lock a named semaphore that only the interpreter's teardown (which
    # exit_now skips) unregisters; one process writes these bars, a thread's lock is enough
    tqdm.set_lock(threading.RLock())
    try:
        model, tokenizer = load_model(Path(path), dtype, device), AutoTokenizer.from_pretrained(path)
    except Exception as e:  # whatever from_pretrained raises, as one line for the server to print
        conn.send(("error", " ".join(f"{type(e).__name__}: {e}".split())))
        return
    ids = special_token_ids(tokenizer)
    stops = {ids[name] for name in STOP_TOKENS}
    outbox: list = []
    relays: dict[int, _Relay] = {}

    def flush() -> None:  # the batcher's thread, after each step: that step's events in one message
        if outbox:
            events = outbox[:]
            del outbox[:]
            try:
                conn.send(events)
            except OSError:  # the server has gone
                pass

    # its queue: the server counts what the child holds and refuses (429) before the child could be full
    batcher = Batcher(model, tokenizer, max_batch, max_batch + max_queue, after_step=flush)
    conn.send(("ready",))
    while True:
        try:
            kind, index, *fields = conn.recv()
        except (EOFError, OSError):  # the server has gone
            break
        if kind == "stop":
            break
        if kind == "submit":
            relays[index] = _Relay(index, outbox, stops)
            batcher.submit(Job(**fields[0], sink=relays[index]))
        elif index in relays:  # cancel
            relays.pop(index).cancelled.set()
        for done in [i for i, relay in relays.items() if relay.finished]:
            del relays[done]
    batcher.stop()
    exit_now(0)
