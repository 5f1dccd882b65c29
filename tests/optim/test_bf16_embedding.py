"""A bfloat16 token embedding (nanochat's on CUDA) in the sharded step: 2 gloo processes under CPU bf16 autocast,
with clipping on, against one process stepping on the averaged gradient. The embedding's gradient is reduced and
its rows gathered in bfloat16, its AdamW moments stay float32, the norm mixes both dtypes."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

sys.path.insert(0, str(Path(__file__).parent))
from optim_helpers import batches, tiny_model  # noqa: E402

MAX_NORM = 0.5
STEPS = 2


def _model():
    model = tiny_model()  # vocab 1031: the embedding's rows do not split evenly over 2 ranks (padded gathers)
    model.get_input_embeddings().to(torch.bfloat16)
    return model


def _loss(model, ids, scale=1.0):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (model(input_ids=ids, labels=ids).loss * scale).backward()


def sharded_worker(rank, world, port, out):  # run in conftest's shared spawn (gloo_runs)
    from nanochat_hf.optim import build_optimizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model()
        opt = build_optimizer(model)
        assert opt.reduces_gradients
        opt.max_grad_norm = MAX_NORM
        norms = []
        for step in batches(STEPS, world):
            _loss(model, step[rank])
            opt.step()
            norms.append(opt.last_grad_norm)
            model.zero_grad(set_to_none=True)
        wte = model.get_input_embeddings().weight
        st = opt.state[wte]
        rows = -(-wte.shape[0] // world)
        assert wte.dtype == torch.bfloat16
        assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.float32
        assert st["exp_avg"].shape[0] == min(rows, wte.shape[0] - rank * rows)  # this rank's rows only
        mine = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        other = torch.empty_like(mine)
        dist.broadcast(other if rank else mine, 0)
        if rank:
            assert torch.equal(mine, other), "parameters differ between ranks"
        else:
            torch.save({"params": {n: p.detach() for n, p in model.named_parameters()}, "norms": norms}, out)
    finally:
        dist.destroy_process_group()


def test_bf16_embedding_in_the_sharded_step(gloo_runs):
    from nanochat_hf.optim import build_optimizer

    got = torch.load(gloo_runs / "bf16" / "rank0.pt", weights_only=True)

    model = _model()
    opt = build_optimizer(model, sharded=False)
    opt.max_grad_norm = MAX_NORM
    norms = []
    for step in batches(STEPS, 2):
        for ids in step:  # the average of the two ranks' gradients (halving is exact in bfloat16 too)
            _loss(model, ids, 0.5)
        opt.step()
        norms.append(opt.last_grad_norm)
        model.zero_grad(set_to_none=True)
    assert min(norms) > 2 * MAX_NORM  # the clipping acts
    assert got["norms"] == pytest.approx(norms, rel=1e-4)
    for name, p in model.named_parameters():
        assert got["params"][name].dtype == p.dtype
        # float32 weights as in tests/training/test_grad_clip.py; the bf16 embedding within one bf16 rounding
        tol = dict(rtol=1e-2, atol=1e-2) if p.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["params"][name], p.detach(), **tol, msg=name)
