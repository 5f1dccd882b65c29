"""Shared by tests/optim: a tiny nanochat model, reference math written from docs/nanochat.md, the 2-process worker."""

import copy
import os

import torch

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315


def tiny_model(n_layer=3, vocab_size=1031, seed=0, dtype=torch.float32):
    """A small nanochat model, every weight random (a fresh model zeroes lm_head and c_proj, which would leave the
    first steps' gradients zero). Odd vocab and odd layer count exercise the padding of the sharded step."""
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    torch.manual_seed(seed)
    config = NanoChatGPTConfig(
        sequence_len=16, vocab_size=vocab_size, n_layer=n_layer, n_head=2, n_kv_head=1, n_embd=64
    )
    model = NanoChatGPTForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model.to(dtype)


def batches(steps, world, vocab_size=1031, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, vocab_size, (2, 17), generator=g) for _ in range(world)] for _ in range(steps)]


def loss_backward(model, ids):
    model(input_ids=ids, labels=ids).loss.backward()


def ref_newton_schulz(g, dtype=torch.bfloat16):
    """Spec section 6, one matrix, each operation separately rounded to ``dtype``."""
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        a = x @ x.T
        b = NS_B * a + NS_C * (a @ a)
        x = NS_A * x + b @ x
    return x.T if tall else x


def ref_muon_step(p, g, buf, lr, momentum):
    """Spec section 6 Muon step (Nesterov) on one matrix, in place on p and buf."""
    buf.lerp_(g, 1 - momentum)
    update = g.lerp(buf, momentum)
    p.sub_(lr * max(1, p.size(0) / p.size(1)) ** 0.5 * ref_newton_schulz(update).to(p.dtype))


def state_bytes(state_dict):
    return sum(
        v.numel() * v.element_size() for st in state_dict["state"].values() for v in st.values() if torch.is_tensor(v)
    )


def flat_params(model):
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


def step_on_average(model, opt, batch_list):
    """One single-process optimizer step on the gradient averaged over ``batch_list`` (one batch per rank)."""
    grads = []
    for ids in batch_list:
        loss_backward(model, ids)
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.zero_grad(set_to_none=True)
    for p, *gs in zip(model.parameters(), *grads):
        p.grad = sum(gs) / len(batch_list)
    opt.step()
    opt.zero_grad(set_to_none=True)


def optim_step_benchmark():
    """benchmarks/optim_step.py as a module: the state-per-rank rules it prints are checked here against real runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "optim_step.py"
    spec = importlib.util.spec_from_file_location("optim_step_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def optim_memory_benchmark():
    """benchmarks/optim_memory.py as a module: its gradient-layout rule is checked here against real runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "optim_memory.py"
    spec = importlib.util.spec_from_file_location("optim_memory_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def consolidated_state_dict(opt):
    """The single-process state dict of a sharded `MuonAdamW` / `NorMuonAdamW`, gathered from every rank's shard
    (collective: call on all ranks); a one-process optimizer can load it. Test-only: it reads the optimizers'
    private layout helpers (`_rows`, `_replicated`, `_muon_chunk`, `optimizer._shape_buckets`)."""
    import torch.distributed as dist

    from nanochat_hf.optim import NorMuonAdamW
    from nanochat_hf.optim.optimizer import _shape_buckets

    sd = opt.state_dict()
    if opt.world_size == 1:
        return sd
    group_ranks = None if opt.process_group is None else dist.get_process_group_ranks(opt.process_group)

    def gather_rows(p, local):  # a tensor whose dim 0 is sharded in ceil(n/W) rows per rank, whole again
        k, start, end = opt._rows(p)
        padded = local.new_zeros((k, *local.shape[1:]))
        padded[: end - start] = local
        full = local.new_empty((k * opt.world_size, *local.shape[1:]))
        dist.all_gather_single(full, padded, group=opt.process_group)
        return full[: p.shape[0]].clone()

    index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    head = isinstance(opt, NorMuonAdamW)
    state = {}
    for group in opt.param_groups:
        if group["kind"] == "adamw":
            for p in group["params"]:
                if p in opt.state:  # AdamW steps on every rank together: every rank has it
                    st = opt.state[p]
                    if head and opt._replicated(p):
                        state[index[id(p)]] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
                    else:
                        state[index[id(p)]] = {
                            "step": st["step"],
                            **{k: gather_rows(p, st[k]) for k in ("exp_avg", "exp_avg_sq")},
                        }
            continue
        if head:  # one stack per group, every rank holding ceil(K/W) matrices of each buffer
            p = group["params"][0]
            if p in opt.state:
                k, _, _ = opt._muon_chunk(group)
                full = {}
                for key, local in opt.state[p].items():
                    gathered = local.new_empty((k * opt.world_size, *local.shape[1:]))
                    dist.all_gather_single(
                        gathered.flatten(0, 1), local.flatten(0, 1).contiguous(), group=opt.process_group
                    )
                    full[key] = gathered[: len(group["params"])].clone()
                state[index[id(p)]] = full
            continue
        for bucket in _shape_buckets(group["params"]):  # matrix i of a same-shape bucket lives on rank i % W
            for i, p in enumerate(bucket):
                owner = i % opt.world_size if group_ranks is None else group_ranks[i % opt.world_size]
                flag = torch.tensor([float(p in opt.state)], device=p.device)
                dist.broadcast(flag, owner, group=opt.process_group)
                if flag.item():
                    buf = (
                        opt.state[p]["momentum_buffer"]
                        if p in opt.state
                        else torch.empty(p.shape, dtype=torch.float32, device=p.device)
                    )
                    dist.broadcast(buf, owner, group=opt.process_group)
                    state[index[id(p)]] = {"momentum_buffer": buf.clone()}
    return {"state": state, "param_groups": sd["param_groups"], "sharding": {"world_size": 1, "rank": 0}}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_jobs(*jobs, log: str | None = None) -> None:
    """Runs gloo jobs ``(worker, world, *args)``, each called as ``worker(rank, world, port, *args)`` on its own
    free port (opening and closing its process group), one after another in ONE spawn of the largest world's
    processes: a process costs seconds of imports, a job's group little. A rank beyond a job's world goes on to the
    next job and waits there for the others. Any job failing fails the spawn (its traceback names the worker);
    ``log``: rank 0 appends each finished job's worker name there, a line each."""
    import torch.multiprocessing as mp

    jobs = [(worker, world, free_port(), args) for worker, world, *args in jobs]
    mp.spawn(_run_jobs, args=(jobs, log), nprocs=max(world for _, world, _, _ in jobs), join=True)


def _run_jobs(rank, jobs, log):
    for worker, world, port, args in jobs:
        if rank < world:
            worker(rank, world, port, *args)
            if log and rank == 0:
                with open(log, "a") as f:
                    f.write(worker.__name__ + "\n")


def _muon_names(model):
    return [n for n, _ in model.named_parameters() if n.startswith("transformer.h.")]


def dist_worker(rank, world, port, steps):
    """Train the tiny model on per-rank batches with the sharded optimizer; rank 0 also steps a single-process
    optimizer on the averaged gradient of the same batches, and every claim of the sharded step is checked."""
    import torch.distributed as dist

    from nanochat_hf.optim import build_optimizer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = batches(steps + 1, world)
        model = tiny_model()
        opt = build_optimizer(model)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.1 * s)
        assert opt.reduces_gradients and opt.world_size == world
        ref = copy.deepcopy(model)
        ref_opt = build_optimizer(ref, sharded=False)
        ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 1.0 - 0.1 * s)
        muon_update_size = 0.0
        for step in range(steps):
            momentum = 0.85 + 0.1 * step / steps
            opt.set_muon_momentum(momentum)
            ref_opt.set_muon_momentum(momentum)
            loss_backward(model, data[step][rank])
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            before = {n: p.detach().clone() for n, p in ref.named_parameters()}
            step_on_average(ref, ref_opt, data[step])  # the reference: one process, ranks' gradients averaged
            ref_sched.step()
            muon_update_size = max(
                muon_update_size,
                max(
                    (p.detach() - before[n]).abs().max().item()
                    for n, p in ref.named_parameters()
                    if n in _muon_names(ref)
                ),
            )

        # 1. parameters bit-identical on every rank
        mine = flat_params(model)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        assert all(torch.equal(everyone[0], other) for other in everyone), "parameters differ across ranks"

        # 2. equal to the single process on the averaged gradient. AdamW: float32 rounding (gloo sums, we divide
        # by 2: exact). Muon: each rank runs Newton-Schulz on a stack of only the matrices it owns; a batched bf16
        # matmul may round a matrix differently depending on the batch around it (here it does not: the result is
        # bit-identical), by a few bf16 ulps (2^-8 relative) of one update, which then feeds back into later
        # gradients. Bound: 5% of the largest single-step Muon update, i.e. ~10 ulps of the update.
        muon_names = set(_muon_names(model))
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            diff = (p.detach() - q.detach()).abs().max().item()
            print(f"rank {rank} {name}: |sharded - single| = {diff:.3g} (one Muon update <= {muon_update_size:.3g})")
            if name in muon_names:
                assert diff <= 0.05 * muon_update_size, f"{name}: {diff} vs one update {muon_update_size}"
            else:
                assert torch.allclose(p, q, rtol=2e-6, atol=1e-7), f"{name}: max diff {diff}"

        # 3. state genuinely sharded, exactly as much as the sharding rule says (benchmarks/optim_step.py prints it)
        state_bytes_per_rank = optim_step_benchmark().state_bytes_per_rank

        muon_shapes = [tuple(p.shape) for n, p in model.named_parameters() if n in muon_names]
        adamw_shapes = [tuple(p.shape) for n, p in model.named_parameters() if n not in muon_names]
        for w, sd in ((world, opt.state_dict()), (1, ref_opt.state_dict())):
            expected = state_bytes_per_rank(muon_shapes, adamw_shapes, w)[rank if w > 1 else 0]
            assert state_bytes(sd) == expected, f"world {w} rank {rank}: {state_bytes(sd)} bytes, rule {expected}"
        fraction = state_bytes(opt.state_dict()) / state_bytes(ref_opt.state_dict())
        print(f"rank {rank} holds {fraction:.1%} of the single-process optimizer state")
        assert fraction <= 0.55, f"rank {rank} holds {fraction:.1%} of the single-process optimizer state"

        # 4. the consolidated state equals the single-process optimizer's state
        full = consolidated_state_dict(opt)
        ref_sd = ref_opt.state_dict()
        assert full["state"].keys() == ref_sd["state"].keys()
        for i, st in full["state"].items():
            for key, v in st.items():
                r = ref_sd["state"][i][key]
                assert (v == r) if key == "step" else torch.allclose(v, r, rtol=1e-4, atol=1e-6), (i, key)

        # 5. per-rank round trip: the step after reloading is bit-identical (native and fallback collectives)
        saved_params = copy.deepcopy(model.state_dict())
        saved_opt = copy.deepcopy(opt.state_dict())
        ids = data[steps][rank]
        loss_backward(model, ids)
        opt.step()
        after = flat_params(model)
        for fallback in (False, True):
            model.load_state_dict(saved_params)
            model.zero_grad(set_to_none=True)
            fresh = build_optimizer(model)
            fresh.load_state_dict(copy.deepcopy(saved_opt))
            fresh._native_rs = not fallback
            loss_backward(model, ids)
            fresh.step()
            again = flat_params(model)
            assert torch.equal(after, again), f"reload (fallback={fallback}) differs"
        # a per-rank state_dict of another world size is refused (checkpoints re-shard: integration/optimizer_state.py)
        try:
            build_optimizer(model).load_state_dict(copy.deepcopy(full))
        except ValueError as e:
            assert f"rank 0 of 1, this is rank {rank} of {world}" in str(e), e
        else:
            raise AssertionError("a single-process state loaded into a sharded optimizer")

        # 6. resume in one process from the consolidated dict (world size 2 -> 1): its next step on the averaged
        # gradient is the sharded optimizer's next step (same tolerance as in 2.)
        single = copy.deepcopy(ref)  # ref holds the parameters the sharded model had when its state was saved
        single_opt = build_optimizer(single, sharded=False)
        single_opt.load_state_dict(copy.deepcopy(full))
        step_on_average(single, single_opt, data[steps])
        resumed_diff = (flat_params(single) - after).abs().max().item()
        assert resumed_diff <= 0.05 * muon_update_size, f"single-process resume differs by {resumed_diff}"
    finally:
        dist.destroy_process_group()


# ---- recipe 2026-07 (nanochat HEAD's optimizer) ------------------------------------------------------------------
HEAD_REFERENCE = os.path.join(os.path.dirname(__file__), "data", "head_reference.safetensors")
HEAD_SCHEDULE = [(1.0 - 0.1 * step, 0.85 + 0.02 * step) for step in range(5)]  # (lr multiplier, Muon momentum)
HEAD_RATES = {"unembedding_lr": 0.004, "embedding_lr": 0.3, "matrix_lr": 0.02, "weight_decay": 0.2}


def named_module(params, n_embd):
    """An nn.Module whose named_parameters() are ``params`` (name -> tensor, in that order), with config.n_embd."""
    from types import SimpleNamespace

    root = torch.nn.Module()
    root.config = SimpleNamespace(n_embd=n_embd)
    for name, value in params.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, torch.nn.Parameter(value.clone()))
    return root


def head_reference():
    """The G5 model's parameters, per-step gradients and nanochat's result (tests/optim/data/README.md): the
    initial parameters and gradients are regenerated from the seed the reference script used, in its order."""
    from safetensors import safe_open

    with safe_open(HEAD_REFERENCE, framework="pt") as f:
        names = f.metadata()["names"].split()
        final = {n: f.get_tensor(f"final/{n}") for n in names}
        keys = [k for k in f.keys() if k.startswith("state/")]  # noqa: SIM118 -- safe_open is not a dict
        state = {k.removeprefix("state/"): f.get_tensor(k) for k in keys}
    g = torch.Generator().manual_seed(1)
    initial = {n: torch.randn(final[n].shape, generator=g) * 0.1 for n in names}
    grads = [{n: torch.randn(final[n].shape, generator=g) for n in names} for _ in HEAD_SCHEDULE]
    return initial, grads, final, state


def head_steps(model, opt, grads, schedule=HEAD_SCHEDULE):
    """Steps with the given per-name gradients and the reference's schedule of LR multiplier and momentum."""
    for step_grads, (lrm, momentum) in zip(grads, schedule):
        for n, p in model.named_parameters():
            p.grad = step_grads[n].clone()
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        opt.set_muon_momentum(momentum)
        opt.step()
        opt.zero_grad(set_to_none=True)


def head_dist_worker(rank, world, port, out_dir, max_grad_norm):
    """Recipe 2026-07 on ``world`` gloo processes, with the reference's gradients (the same on every rank, so the
    average is the gradient): writes rank 0's parameters and consolidated state, and every rank's state bytes."""
    import torch.distributed as dist

    from nanochat_hf.optim import build_optimizer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        initial, grads, _, _ = head_reference()
        model = named_module(initial, n_embd=32)
        opt = build_optimizer(model, **HEAD_RATES, recipe="2026-07")
        opt.max_grad_norm = max_grad_norm
        assert opt.reduces_gradients and opt.world_size == world
        head_steps(model, opt, grads)
        full = consolidated_state_dict(opt)
        own = state_bytes(opt.state_dict())
        mine = flat_params(model)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        if rank == 0:
            torch.save(
                {
                    "params": {n: p.detach() for n, p in model.named_parameters()},
                    "state": full["state"],
                    "same_on_every_rank": all(torch.equal(everyone[0], other) for other in everyone),
                    "grad_norm": opt.last_grad_norm,
                },
                os.path.join(out_dir, "result.pt"),
            )
        torch.save(own, os.path.join(out_dir, f"bytes{rank}.pt"))
    finally:
        dist.destroy_process_group()


# ---- other transformers models (the "roles" routing) ------------------------------------------------------------
ARCHS = ("llama", "qwen3", "gemma", "gpt2", "qwen2_moe", "mixtral", "olmoe")
MOE_ARCHS = ("mixtral", "qwen2_moe", "olmoe")  # experts stacked (E, out, in): Muon per expert
SPLIT_ARCHS = ("phi3", "gpt2", "mixtral")  # also sharded with split_fused=True (Linear, Conv1D, experts)
DIST_CASES = [(arch, False) for arch in ARCHS] + [(arch, True) for arch in SPLIT_ARCHS]
MOE_ROLES = {"*.experts.*": "scalar"}  # the override: stacked expert weights in AdamW


def tiny_hf(arch, seed=0):
    """A tiny random transformers causal LM of the given architecture (no download: built from a config)."""
    from transformers import (
        AutoModelForCausalLM,
        FalconConfig,
        GemmaConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MixtralConfig,
        OlmoeConfig,
        Phi3Config,
        Qwen2MoeConfig,
        Qwen3Config,
    )

    small = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    configs = {
        "llama": lambda: LlamaConfig(**small),
        "qwen3": lambda: Qwen3Config(**small, head_dim=8),
        "gemma": lambda: GemmaConfig(**small, head_dim=8),
        "gpt2": lambda: GPT2Config(
            vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        ),
        "qwen2_moe": lambda: Qwen2MoeConfig(
            **small, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32
        ),
        "mixtral": lambda: MixtralConfig(**small, num_local_experts=3, num_experts_per_tok=2),
        "olmoe": lambda: OlmoeConfig(**small, num_experts=5, num_experts_per_tok=2),
        "phi3": lambda: Phi3Config(**small, pad_token_id=0, bos_token_id=0, eos_token_id=0),
        "gpt_neox": lambda: GPTNeoXConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
        ),
        "falcon": lambda: FalconConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
        ),  # fmt: skip
    }
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(configs[arch]())


def fixed_grads(model, steps, rank, seed=3):
    """Per step, a gradient per parameter name for this rank (ranks differ; the same on every call)."""
    g = torch.Generator().manual_seed(seed + 1000 * rank)
    names = [(n, p.shape) for n, p in model.named_parameters() if p.requires_grad]
    return [{n: torch.randn(shape, generator=g) for n, shape in names} for _ in range(steps)]


def step_fixed(model, opt, grads):
    """Optimizer steps with the given per-name gradients, the LR scaled down a little each step."""
    for i, step_grads in enumerate(grads):
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.grad = step_grads[n].clone()
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * (1.0 - 0.1 * i)
        opt.step()
        opt.zero_grad(set_to_none=True)


def archs_dist_worker(rank, world, port, steps, out_dir):
    """Every tiny architecture in both recipes on ``world`` gloo ranks with per-rank fixed gradients (the model also
    wrapped in DDP, whose averaging is then silenced); rank 0 compares with one process stepping on the average."""
    import torch.distributed as dist

    from nanochat_hf.integration.gradients import silence_ddp
    from nanochat_hf.optim import build_optimizer
    from nanochat_hf.optim.reduction import rows_per_rank

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    worst = {}
    try:
        for arch, split in DIST_CASES:
            for recipe in ("2025-12", "2026-07"):
                model = tiny_hf(arch)
                ref = copy.deepcopy(model)
                wrapped = torch.nn.parallel.DistributedDataParallel(model)
                opt = build_optimizer(wrapped, recipe=recipe, polar_dtype="float32", split_fused=split)
                silence_ddp(wrapped, opt)
                assert opt.world_size == world and opt.reduces_gradients
                step_fixed(model, opt, fixed_grads(model, steps, rank))
                for p in model.parameters():  # an expert stack: this rank's experts' state only (docs/distributed.md)
                    if p.ndim == 3 and "momentum_buffer" in opt.state[p]:
                        _, start, end = rows_per_rank(p.shape[0], world, rank)
                        assert opt.state[p]["momentum_buffer"].shape[0] == end - start < p.shape[0]
                ref_opt = build_optimizer(ref, recipe=recipe, polar_dtype="float32", sharded=False, split_fused=split)
                per_rank = [fixed_grads(ref, steps, r) for r in range(world)]
                avg = [{n: sum(gs[s][n] for gs in per_rank) / world for n in per_rank[0][s]} for s in range(steps)]
                step_fixed(ref, ref_opt, avg)
                for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                    rel = ((p.detach() - q.detach()).norm() / q.detach().norm()).item()
                    key = f"{arch}{' split' if split else ''} {recipe}"
                    worst[key] = max(worst.get(key, 0.0), rel)
        if rank == 0:
            torch.save(worst, os.path.join(out_dir, "worst.pt"))
    finally:
        dist.destroy_process_group()


# ---- ZeRO-2: reduction during backward (optim/reduction.py) ------------------------------------------------------
def held_grad_bytes(opt):
    """Bytes of gradient this rank holds: every ``.grad`` plus the reduced pieces kept beside the parameters."""
    grads = sum(
        p.grad.numel() * p.grad.element_size() for g in opt.param_groups for p in g["params"] if p.grad is not None
    )
    kept = {id(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None}
    side = sum(t.numel() * t.element_size() for t in opt._reducer.pieces.values() if id(t) not in kept)
    return grads + side


def overlap_worker(rank, world, port, recipe):
    """Three replicas of the tiny model with 2 micro-batches per step: reduction at the step (A), during backward
    (B, hooks), and gradients averaged by hand with ``grads_averaged`` (C). B and C must equal A bit for bit; after
    B's last backward a rank holds only its own pieces."""
    import torch.distributed as dist

    from nanochat_hf.optim import build_optimizer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = batches(3, 2 * world)
        models = [tiny_model() for _ in range(3)]
        opts = [build_optimizer(m, recipe=recipe) for m in models]
        for opt in opts:
            opt.max_grad_norm = 1.0  # clipping by the averaged gradient's norm, in every path
        last = [False]
        opts[1].reduce_during_backward(lambda: last[0])
        opts[2].grads_averaged = True
        assert not opts[2].reduces_gradients
        full_bytes = sum(p.numel() * p.element_size() for p in models[0].parameters())
        muon = [tuple(p.shape) for n, p in models[0].named_parameters() if n.startswith("transformer.h.")]
        adamw = [tuple(p.shape) for n, p in models[0].named_parameters() if not n.startswith("transformer.h.")]
        rule = optim_memory_benchmark().grad_bytes_per_rank(muon, adamw, world, recipe)
        assert sum(optim_memory_benchmark().grad_bytes_per_rank(muon, adamw, 1, recipe)) == full_bytes
        for step in range(3):
            micro = data[step][2 * rank : 2 * rank + 2]
            for i, ids in enumerate(micro):
                last[0] = i == len(micro) - 1
                for m in models:
                    loss_backward(m, ids)
            opts[1]._reducer._wait_all()  # the one unit still in flight lands (the step would wait for it first)
            held = held_grad_bytes(opts[1])
            for p in models[2].parameters():  # C: averaged by hand, as a DDP that could not be silenced would
                dist.all_reduce(p.grad)
                p.grad.div_(world)
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
            # step 0 reduces in reverse parameter order and learns the hooks' order; later steps use that order.
            # A rank holds exactly what the layout rule gives it (benchmarks/optim_memory.py prints it for d20/d32)
            print(f"rank {rank} {recipe} step {step}: {held} of {full_bytes} gradient bytes held after backward")
            assert held == rule[rank], (held, rule)
        a, b, c = (flat_params(m) for m in models)
        assert torch.equal(a, b), f"{recipe}: reduction during backward differs from reduction at the step"
        assert torch.equal(a, c), f"{recipe}: grads_averaged differs from the optimizer's own reduction"
        assert opts[0].last_grad_norm == opts[1].last_grad_norm == opts[2].last_grad_norm
    finally:
        dist.destroy_process_group()


# ---- buckets of the ZeRO-2 reduction (optim/reduction.py) -----------------------------------------------------
BUCKET_SHAPES = {  # recipe -> (Muon stacks, AdamW parameters): dims 0 that 3 does not divide, empty rows at W = 3
    "2025-12": ([[(5, 3), (5, 3), (7, 2), (5, 3), (7, 2)], [(5, 2, 3)]], [(7, 4), (1, 6), (11,), (2, 6)]),
    # 2026-07: one Muon group per shape; AdamW below 1024 elements replicated ("whole"), above by rows
    "2026-07": ([[(5, 3)] * 4, [(7, 2)] * 2, [(5, 2, 3)]], [(37, 32), (5,), (1030,), (2, 3), (1, 1100)]),
}


def bucket_optimizer(recipe, bucket_bytes):
    """An optimizer of BUCKET_SHAPES[recipe] (its parameters in group order) with ``bucket_bytes`` buckets."""
    from nanochat_hf.optim.head import NorMuonAdamW
    from nanochat_hf.optim.optimizer import MuonAdamW
    from nanochat_hf.optim.reduction import GradientReducer

    muon, adamw = BUCKET_SHAPES[recipe]
    common = {"lr": 0.01, "initial_lr": 0.01, "weight_decay": 0.0}
    groups = [
        {
            "kind": "muon",
            "name": f"m{i}",
            "momentum": 0.9,
            "nesterov": True,
            "ns_steps": 5,
            "beta2": 0.95,
            "polar_dtype": "float32",
            "params": [torch.nn.Parameter(torch.zeros(s)) for s in shapes],
            **common,
        }
        for i, shapes in enumerate(muon)
    ] + [
        {
            "kind": "adamw",
            "name": f"a{i}",
            "betas": (0.8, 0.95),
            "eps": 1e-10,
            "params": [torch.nn.Parameter(torch.zeros(s))],
            **common,
        }
        for i, s in enumerate(adamw)
    ]
    opt = (MuonAdamW if recipe == "2025-12" else NorMuonAdamW)(groups)
    opt._reducer = GradientReducer(opt, bucket_bytes)
    return opt


def bucket_worker(rank, world, port):
    """Every parameter's averaged piece on this rank, reduced unit by unit, in buckets of a few units (mixed kinds
    and owners) and all in one bucket, with native and fallback reduce-scatter: each must equal the rows/whole
    gradient the layout gives this rank of the one-process average. The gradients are small integers, so every
    summation order gives the same sum and the one-process average is exact to the bit."""
    import torch.distributed as dist

    from nanochat_hf.optim.reduction import rows_per_rank

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for recipe in BUCKET_SHAPES:
            params = [p for g in bucket_optimizer(recipe, 0).param_groups for p in g["params"]]
            per_rank = []
            for r in range(world):
                g = torch.Generator().manual_seed(100 + r)
                per_rank.append([torch.randint(-64, 64, p.shape, generator=g).float() for p in params])
            average = [sum(gs[i] for gs in per_rank) / world for i in range(len(params))]
            mixed = 0
            for bucket_bytes in (0, 160, 2**30):
                for fallback in (False, True):
                    opt = bucket_optimizer(recipe, bucket_bytes)
                    opt._native_rs = opt._native_rs and not fallback
                    ps = [p for g in opt.param_groups for p in g["params"]]
                    for p, grad in zip(ps, per_rank[rank]):
                        p.grad = grad.clone()
                    buckets = opt._reducer.buckets
                    if bucket_bytes in (0, 2**30):  # each unit alone; all in one
                        assert len(buckets) == (len(ps) if bucket_bytes == 0 else 1)
                    else:
                        assert 1 < len(buckets) < len(ps)
                    for b in buckets:  # buckets with several units of one kind (one flat collective for them)
                        kinds = [opt._plan(ps[i]) for i in b]
                        mixed += any(kinds.count(k) > 1 for k in kinds)
                    pieces = opt._reducer.finish()
                    case = f"{recipe} W={world} rank {rank} bucket_bytes={bucket_bytes} fallback={fallback}"
                    for i, p in enumerate(ps):
                        kind, *owner = opt._plan(p)
                        if kind == "rows":
                            _, start, end = rows_per_rank(p.shape[0], world, rank)
                            expected, grad = average[i][start:end], None
                        elif kind == "whole" or owner[0] == rank:
                            expected = grad = average[i]
                        else:
                            expected = grad = None
                        got = pieces.get(p)
                        assert (got is None) == (expected is None), f"{case}: param {i} {kind} piece {got}"
                        assert expected is None or torch.equal(got, expected), f"{case}: param {i} {kind}"
                        assert (p.grad is None) == (grad is None), f"{case}: param {i} {kind} .grad"
                        assert grad is None or p.grad is got, f"{case}: param {i}: .grad is not the piece"
            assert mixed >= 4, f"{recipe}: only {mixed} buckets hold several units of one kind"
    finally:
        dist.destroy_process_group()
