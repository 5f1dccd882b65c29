"""FSDP2 workers for tests/optim/test_fsdp.py (spawned by torch.multiprocessing on gloo, one thread each)."""

import copy
import os
import sys

import torch
import torch.distributed as dist

STEPS = 5
# float32 orthogonalisation: bfloat16 would turn the last-bit differences of summation order into bfloat16 ulps
SETTINGS = {"2025-12": {"polar_dtype": "float32"}, "2026-07": {"polar_dtype": "float32", "recipe": "2026-07"}}


def models():
    """(name, model, vocab size): nanochat's GPT as G0 (the December model) and as G5, and a small Llama, each
    with a Muon matrix whose rows W = 4 does not divide (G5's value-embedding gate: 2 rows; Llama's MLP: 30); a
    Mixtral, whose 3 experts per stack leave rank 3 of 4 none; a Phi3 with its fused projections split."""
    from optim_helpers import tiny_hf, tiny_model
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
    from test_generations import random_generation_model

    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=101,
            hidden_size=32,
            intermediate_size=30,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    return [
        ("G0", tiny_model(), 1031),
        ("G0 late", tiny_model(), 1031),  # sharded after the optimizer was built, as under Accelerate
        ("G5", random_generation_model("g5"), 50),
        ("llama", llama, 101),
        ("mixtral", tiny_hf("mixtral"), 128),
        ("phi3 split", tiny_hf("phi3"), 128),  # split_fused=True: q, k, v and gate, up orthogonalised apart
    ]


def shard(model):
    """fully_shard every decoder layer, then the root (what Accelerate's FSDP2 auto-wrap does)."""
    from torch.distributed.fsdp import fully_shard

    layers = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)


def shard_after_building(model, settings):
    """What Accelerate's FSDP2 does under the Trainer: the optimizer is built on the whole model, then the model is
    sharded and the DTensors are swapped into the optimizer's param groups by name. Returns the optimizer."""
    from nanochat_hf.optim import build_optimizer

    opt = build_optimizer(model, **settings)
    names = {p: n for n, p in model.named_parameters()}
    before = [[names[p] for p in group["params"]] for group in opt.param_groups]
    shard(model)
    sharded = dict(model.named_parameters())
    for group, group_names in zip(opt.param_groups, before):
        group["params"] = [sharded[n] for n in group_names]
    return opt


def same_numbers_worker(rank, world, port, out_dir, max_grad_norm, orders=True):
    """Each model in each recipe (G0 also sharded after building the optimizer): STEPS FSDP2 steps on this rank's
    slice of the global batches. Rank 0 also trains copies in one process on the ranks' slices as micro-batches,
    their gradients averaged (as FSDP2 averages them): in rank order, the reference, then (``orders``) reversed and
    rotated, whose distance to it is what summation order alone moves. Rank 0 writes, per (model, recipe), the
    relative difference per tensor of FSDP2 and (``orders``, else False) of the other orders to the reference, the
    last gradient norms, the consolidated FSDP2 optimizer state next to the reference's, and every rank's parameter
    and gradient bytes (out_dir/result.pt)."""
    from optim_helpers import consolidated_state_dict, step_on_average

    from nanochat_hf.optim import build_optimizer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for name, model, vocab in models():
            g = torch.Generator().manual_seed(1)
            slices = [list(torch.randint(0, vocab, (world * 2, 17), generator=g).split(2)) for _ in range(STEPS)]
            for recipe, settings in SETTINGS.items():
                settings = {**settings, "split_fused": True} if name.endswith("split") else settings
                sharded = copy.deepcopy(model)
                if name.endswith("late"):
                    opt = shard_after_building(sharded, settings)
                else:
                    shard(sharded)
                    opt = build_optimizer(sharded, **settings)
                opt.max_grad_norm = max_grad_norm
                assert not opt.reduces_gradients and opt.fsdp_mesh is not None and opt.world_size == world
                for i, step in enumerate(slices):
                    sharded(input_ids=step[rank], labels=step[rank]).loss.backward()
                    opt.step()
                    if i + 1 < len(slices):  # the last gradients stay, to be counted
                        opt.zero_grad(set_to_none=True)
                fsdp = {n: p.full_tensor() for n, p in sharded.named_parameters()}
                # expert rows' state is checked rank by rank in test_routing's 2-process worker; this consolidation
                # covers whole matrices and stacks
                state = None if name == "mixtral" else consolidated_state_dict(opt)["state"]
                held = [None] * world  # every rank's parameter and gradient bytes after the last backward
                mine = [sum(t.to_local().numel() * t.element_size() for t in ts) for ts in (
                    [p for p in sharded.parameters()], [p.grad for p in sharded.parameters()])]  # fmt: skip
                dist.all_gather_object(held, mine)
                if rank != 0:
                    continue
                runs = []  # the ranks' micro-batches in rank order, reversed, rotated by one
                for order in (slice(None), slice(None, None, -1), "rotated") if orders else (slice(None),):
                    single = copy.deepcopy(model)
                    single_opt = build_optimizer(single, sharded=False, **settings)
                    single_opt.max_grad_norm = max_grad_norm
                    for step in slices:
                        step_on_average(single, single_opt, step[1:] + step[:1] if order == "rotated" else step[order])
                    runs.append((dict(single.named_parameters()), single_opt))
                (ref, ref_opt), *others = runs

                def rel(a, b):
                    return ((a.detach() - b.detach()).norm() / b.detach().norm()).item()

                results[name, recipe] = {
                    "fsdp": {n: rel(fsdp[n], q) for n, q in ref.items()},
                    "order": {n: max(rel(other[n], q) for other, _ in others) for n, q in ref.items()}
                    if orders
                    else None,
                    "exact": all(torch.equal(fsdp[n], q) for n, q in ref.items()),
                    "grad_norm": (opt.last_grad_norm, ref_opt.last_grad_norm),
                    "state": (state, ref_opt.state_dict()["state"]),
                    "held": held,
                    "shapes": [tuple(p.shape) for p in model.parameters()],
                }
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "result.pt"))
    finally:
        dist.destroy_process_group()
