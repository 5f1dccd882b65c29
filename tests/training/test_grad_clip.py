"""--max_grad_norm under several processes: the sharded step clips the AVERAGED gradient (2 gloo processes vs one
process clipping the averaged gradient with torch.nn.utils.clip_grad_norm_, as the Trainer does)."""

import os
import sys

import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

MAX_NORM = 0.05


def _model():
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    torch.manual_seed(0)
    model = NanoChatGPTForCausalLM(
        NanoChatGPTConfig(vocab_size=96, n_layer=2, n_head=1, n_kv_head=1, n_embd=64, sequence_len=16)
    )
    with torch.no_grad():  # no zero-initialised matrices: every parameter gets a gradient
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def _batches(world):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 96, (2, 17), generator=g) for _ in range(world)]


def _worker(rank, world, port, out):  # run as a script: python test_grad_clip.py RANK WORLD PORT OUT
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
        for _ in range(2):
            x = _batches(world)[rank]
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            norms.append(opt.last_grad_norm)
            model.zero_grad(set_to_none=True)
        if rank == 0:
            torch.save({"params": {n: p.detach() for n, p in model.named_parameters()}, "norms": norms}, out)
    finally:
        dist.destroy_process_group()


def test_two_processes_clip_the_averaged_gradient(tmp_path, two_ranks):
    from nanochat_hf.optim import build_optimizer

    out = tmp_path / "rank0.pt"
    two_ranks(__file__, out)
    got = torch.load(out, weights_only=True)

    model = _model()
    opt = build_optimizer(model, sharded=False)
    norms = []
    for _ in range(2):
        for x in _batches(2):  # the average of the two ranks' gradients
            (model(input_ids=x, labels=x).loss / 2).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        opt.step()
        model.zero_grad(set_to_none=True)
    assert min(norms) > 10 * MAX_NORM  # the clipping acts
    # step 1: the same weights, so the same norm up to summation order; step 2 also carries the sharded step's
    # rounding differences (batched bfloat16 Newton-Schulz over other matrix sets), as in test_multiprocess
    assert got["norms"][0] == pytest.approx(norms[0], rel=1e-6)
    assert got["norms"][1] == pytest.approx(norms[1], rel=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["params"][name], p.detach(), rtol=1e-4, atol=1e-5, msg=name)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
