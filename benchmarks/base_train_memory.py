"""Peak memory per rank of one base_train step of d20, d24, d26 and d32 on an 8-GPU node, estimated without a GPU.

    python benchmarks/base_train_memory.py                 # the table (d20, d24, d26, d32; ZeRO-2 and FSDP2)
    python benchmarks/base_train_memory.py --validate      # the method against real tensors at a tiny size
    python benchmarks/base_train_memory.py --models d20 --modes zero2 --world 8

What is run: our model (`base_model_config`: HEAD's depth rule, aspect ratio 64, head dim 128, SSSL windows,
vocabulary 32768, HEAD's tok_train default), our optimizer (recipe 2026-07, Muon's Polar Express in bfloat16 as on an
SM 9.0 GPU) and two optimizer steps of 2 accumulated micro-batches of device_batch_size x 2048 tokens under bf16
autocast, as base_train runs them at W = 8:
- zero2 (our default with several processes): every parameter whole, the token embedding in bfloat16 (what
  base_train's `embedding_dtype auto` does under bf16 on CUDA), gradients reduced onto their owner during the last
  micro-batch's backward (`reduce_during_backward`), the optimizer state 1/W;
- fsdp2 (`--fully_shard true`): `fully_shard` per block and the root (`run.fully_shard_blocks`), the embedding
  float32, the gradient reduce-scatter deferred to the last micro-batch as the Trainer's mixin does.
Device batch: HEAD's own for these depths (runs/speedrun.sh and runs/miniseries.sh: 16 up to d26, 8 from d28 on).
Two micro-batches hold what any accumulation >= 2 holds (the first one's gradients during the next's forward and
backward); HEAD's batch rule gives 4 (d20-d26) and 16 (d32) micro-batches per step at these device batches on 8 GPUs.

How (torchtitan's memory estimation): one process, a fake process group of W ranks (`fake_pg.FakeStore`: every
collective returns at once), every tensor a FakeTensor (`FakeTensorMode`: shapes, dtypes and storages, no memory),
and torch's `MemTracker` / `FSDPMemTracker` counting the bytes of live storages by kind (parameters, gradients,
optimizer state, activations, temporaries) through the step; the peak is the largest total. What that leaves out:
the CUDA caching allocator's fragmentation and reserve, the CUDA context and kernels' workspaces (cuBLAS,
flash-attention), NCCL buffers; and the attention kernel is CPU's SDPA (its saved tensors, not flash-attention's).
Fake tensors cannot be on 'cuda' in this CPU-only torch (a fake 'cuda' tensor is made, but weight init, bf16
autocast and ops reach the CUDA runtime), so they are on 'cpu', under CPU bf16 autocast (which casts linear, matmul
and attention to bfloat16 as CUDA's does). Four workarounds, all outside the product: the model is built on the
meta device and its tensors replaced by fake empty ones (init draws random numbers); the ZeRO-2 reducer's first-step
broadcast of rank 0's hook order is skipped (a `.tolist()` of fake data; with one real rank it is a no-op); FSDP2's
device mesh is made before fake mode (its rank list is data); the check that bfloat16 matmuls run (a trial product
read back) is skipped. `--validate` runs a tiny model both ways, fake and
with real tensors under the same fake process group and tracker, and prints both peaks.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import types

import torch
import torch.distributed as dist

# HEAD's device batch at each depth (runs/speedrun.sh d24; runs/miniseries.sh: 16 for d20-d27, 8 from d28)
MODELS = {"d20": (20, 16), "d24": (24, 16), "d26": (26, 16), "d32": (32, 8)}
SEQ, VOCAB, MICRO_BATCHES = 2048, 32768, 2
GiB = 2**30


class _Tokenizer:
    """What base_model_config reads of a tokenizer: HEAD's 32768-token vocabulary."""

    bos_token_id = eos_token_id = pad_token_id = 0

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab


def _learned_order(self) -> list[int]:
    """GradientReducer's first-step order without its broadcast from rank 0 (this process is rank 0)."""
    seen = set(self.fired)
    return self.fired + [i for i in self.order if i not in seen]


@contextlib.contextmanager
def estimating(world: int):
    """The fake process group of `world` ranks and the four workarounds of the docstring, undone on exit."""
    import torch.distributed.fsdp._fully_shard._fully_shard as fsdp_api
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from nanochat_hf.optim import precision, reduction

    saved = (fsdp_api._init_default_mesh, reduction.GradientReducer._learned_order, precision._check_runs_bfloat16)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        fsdp_api._init_default_mesh = lambda *args, **kwargs: mesh
        reduction.GradientReducer._learned_order = _learned_order
        precision._check_runs_bfloat16 = lambda device: None  # a trial bfloat16 matmul's .item() (fake data)
        yield
    finally:
        fsdp_api._init_default_mesh, reduction.GradientReducer._learned_order, precision._check_runs_bfloat16 = saved
        dist.destroy_process_group()


def build(depth: int, seq: int, vocab: int, mode: str):
    """Our model as base_train builds it, its tensors empty (fake under FakeTensorMode), sharded by `mode`, and the
    optimizer; returns (model, optimizer, is_last) where is_last is the list whose flag says the micro-batch."""
    from nanochat_hf.model import NanoChatGPTForCausalLM
    from nanochat_hf.optim import build_optimizer
    from nanochat_hf.training.base import base_model_config
    from nanochat_hf.training.run import fully_shard_blocks

    args = types.SimpleNamespace(depth=depth, aspect_ratio=64, head_dim=128, max_seq_len=seq, window_pattern="SSSL")
    with torch.device("meta"):
        model = NanoChatGPTForCausalLM(base_model_config(args, _Tokenizer(vocab)))
    if mode == "zero2":  # embedding_dtype auto under bf16 on CUDA, not under FSDP2
        emb = model.get_input_embeddings()
        emb.weight = torch.nn.Parameter(emb.weight.to(torch.bfloat16))
    for module in model.modules():  # to_empty swaps tensors, which fake tensors refuse: replace them
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype)
    if mode == "fsdp2":
        fully_shard_blocks(model)
    optimizer = build_optimizer(model, recipe="2026-07", polar_dtype=torch.bfloat16)
    last = [True]
    if mode == "zero2":
        optimizer.reduce_during_backward(lambda: last[0], model_order=tuple(model.parameters()))
    return model, optimizer, last


def peak(depth: int, batch: int, mode: str, seq: int = SEQ, vocab: int = VOCAB, fake: bool = True) -> dict:
    """Peak bytes of this rank over two optimizer steps (the second has its optimizer state), by kind."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode() if fake else contextlib.nullcontext():
        model, optimizer, last = build(depth, seq, vocab, mode)
        if mode == "fsdp2":
            tracker = FSDPMemTracker(model, optimizer)
        else:
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
        ids = torch.zeros((batch, seq + 1), dtype=torch.long)
        with tracker:
            for _ in range(2):
                for micro in range(MICRO_BATCHES):
                    tracker.reset_mod_stats()  # keeps the peak; its module stats allow one forward per iteration
                    last[0] = micro == MICRO_BATCHES - 1
                    if mode == "fsdp2":
                        model.set_requires_gradient_sync(last[0])
                    with torch.autocast("cpu", torch.bfloat16):
                        loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
                    (loss / MICRO_BATCHES).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    return {str(k).split(".")[-1].lower() if not isinstance(k, str) else k.lower(): v for k, v in snapshot.items()}


def kinds(snapshot: dict) -> dict[str, int]:
    """Parameters, gradients, optimizer state, activations (+ temporaries, inputs), collectives, total."""

    def total(*words):
        return sum(v for k, v in snapshot.items() if any(w in k for w in words))

    return {
        "params": total("param"),
        "grads": total("grad"),
        "state": total("opt"),
        "activations": total("act", "temp", "inp"),
        "comm": total("all_gather", "reduce_scatter"),
        "total": snapshot["total"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--modes", default="zero2,fsdp2")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--validate", action="store_true", help="fake against real tensors at depth 2, 256 tokens")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with estimating(args.world):
        table(args)


def table(args: argparse.Namespace) -> None:
    modes = args.modes.split(",")
    if args.validate:
        print(f"| mode | fake peak (MiB) | real peak (MiB) | W = {args.world} (fake process group), depth 2, 2 x 256 |")
        print("|---|---|---|---|")
        for mode in modes:
            fake, real = (peak(2, 2, mode, seq=256, fake=f)["total"] for f in (True, False))
            print(f"| {mode} | {fake / 2**20:.2f} | {real / 2**20:.2f} | {'equal' if fake == real else 'differ'} |")
        return
    print(f"per rank of W = {args.world}, GiB (estimate: fake tensors, see the docstring); seq {SEQ}, vocab {VOCAB}")
    print("\n| model | device batch | mode | params | grads | optimizer state | activations | collectives | peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        depth, batch = MODELS[name]
        for mode in modes:
            t0 = time.perf_counter()
            k = kinds(peak(depth, batch, mode))
            cells = " | ".join(f"{k[c] / GiB:.2f}" for c in ("params", "grads", "state", "activations", "comm"))
            print(f"| {name} | {batch} | {mode} | {cells} | {k['total'] / GiB:.2f} |", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
