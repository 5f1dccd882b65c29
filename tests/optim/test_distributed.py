"""The sharded (ZeRO-2) step on gloo ranks, in conftest's shared spawn (gloo_runs): optim_helpers' workers assert
inside, so a failure fails the spawn with the worker's traceback."""

import pytest


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_step_reduction_during_backward_and_buckets(gloo_runs):
    """dist_worker: two processes, per-rank batches: identical parameters on both ranks and equal to one process
    stepping on the averaged gradient, half the optimizer state per rank, exact per-rank and consolidated reloads.

    overlap_worker, each recipe: ZeRO-2 on two gloo ranks, gradient accumulation 2: reducing during the last
    micro-batch's backward gives the same bits as reducing at the step and as gradients averaged elsewhere
    (``grads_averaged``), and after backward a rank holds about half of the gradient bytes.

    bucket_worker: three gloo ranks, dims 0 that 3 does not divide (and empty rows), both recipes: the reduction in
    buckets (several units of one kind in one collective, every kind) gives each rank exactly the pieces of the
    one-process average the layout gives it, as each unit alone does; a bucket that mixed up rows between
    parameters or ranks would not."""
    done = (gloo_runs / "done").read_text().split()
    assert [w for w in done if w in ("dist_worker", "overlap_worker", "bucket_worker")] == [
        "dist_worker", "overlap_worker", "overlap_worker", "bucket_worker"
    ]  # fmt: skip
