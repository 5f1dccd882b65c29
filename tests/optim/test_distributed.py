import socket

import pytest
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_step_on_two_gloo_ranks(helpers):
    """Two processes, per-rank batches: identical parameters on both ranks and equal to one process stepping on
    the averaged gradient, half the optimizer state per rank, exact per-rank and consolidated reloads."""
    mp.spawn(helpers.dist_worker, args=(2, _free_port(), 4), nprocs=2, join=True)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("recipe", ["2025-12", "2026-07"])
def test_reduction_during_backward(helpers, recipe):
    """ZeRO-2 on two gloo ranks, gradient accumulation 2: reducing during the last micro-batch's backward gives the
    same bits as reducing at the step and as gradients averaged elsewhere (``grads_averaged``), and after backward
    a rank holds about half of the gradient bytes."""
    mp.spawn(helpers.overlap_worker, args=(2, _free_port(), recipe), nprocs=2, join=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_buckets_keep_each_rank_its_rows(helpers):
    """Three gloo ranks, dims 0 that 3 does not divide (and empty rows), both recipes: the reduction in buckets
    (several units of one kind in one collective, every kind) gives each rank exactly the pieces of the one-process
    average the layout gives it, as each unit alone does; a bucket that mixed up rows between parameters or ranks
    would not."""
    mp.spawn(helpers.bucket_worker, args=(3, _free_port()), nprocs=3, join=True)
