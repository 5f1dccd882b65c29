"""The sharded (ZeRO-2) step on gloo ranks: one spawn runs every check (optim_helpers' workers assert inside, so a
failure fails the spawn with the worker's traceback; a process costs seconds of imports, a check little)."""

import pytest


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_step_reduction_during_backward_and_buckets(helpers):
    """dist_worker: two processes, per-rank batches: identical parameters on both ranks and equal to one process
    stepping on the averaged gradient, half the optimizer state per rank, exact per-rank and consolidated reloads.

    overlap_worker, each recipe: ZeRO-2 on two gloo ranks, gradient accumulation 2: reducing during the last
    micro-batch's backward gives the same bits as reducing at the step and as gradients averaged elsewhere
    (``grads_averaged``), and after backward a rank holds about half of the gradient bytes.

    bucket_worker: three gloo ranks, dims 0 that 3 does not divide (and empty rows), both recipes: the reduction in
    buckets (several units of one kind in one collective, every kind) gives each rank exactly the pieces of the
    one-process average the layout gives it, as each unit alone does; a bucket that mixed up rows between
    parameters or ranks would not."""
    helpers.spawn_jobs(
        (helpers.dist_worker, 2, 4),
        *((helpers.overlap_worker, 2, recipe) for recipe in ("2025-12", "2026-07")),
        (helpers.bucket_worker, 3),
    )
