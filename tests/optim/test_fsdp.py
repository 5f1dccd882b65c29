"""nanochat's optimizer on FSDP2 (optim/fsdp.py): `fully_shard` on gloo processes against one process.

The reference is one process stepping on the ranks' batches as micro-batches, gradients averaged (what FSDP2's
reduce-scatter computes). With 2 ranks the average is the same sum in the same order (FSDP2 divides each gradient
by 2 first: exact), so without clipping the parameters are bit-identical. With 4 ranks gloo sums in its own order,
and with clipping the global norm is summed per shard: the last bits move, and Newton-Schulz / Polar Express and
AdamW on near-zero gradients amplify them (measured: up to 1.3e-5 relative on G5's smear_lambda, 6e-6 on a Llama
o_proj). The bound is therefore 1e-6 relative per tensor, or 4 times what summing the same micro-batches in
another order (reversed, rotated) moves that tensor in one process, whichever is larger.
"""

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def same_numbers(helpers, tmp_path_factory):
    """same_numbers(world): fsdp_helpers.same_numbers_worker's results on 2 ranks without clipping (the one-process
    reference alone) and on 4 ranks clipping at 0.3 (with the other summation orders): one spawn of 4 processes."""
    import fsdp_helpers

    out = {world: tmp_path_factory.mktemp(f"fsdp{world}") for world in (2, 4)}
    helpers.spawn_jobs(
        (fsdp_helpers.same_numbers_worker, 2, str(out[2]), 0.0, False),
        (fsdp_helpers.same_numbers_worker, 4, str(out[4]), 0.3, True),
    )

    def results(world):
        results = torch.load(out[world] / "result.pt")
        assert {key for key in results} == {
            (m, r) for m in ("G0", "G0 late", "G5", "llama", "mixtral", "phi3 split") for r in ("2025-12", "2026-07")
        }
        return results

    return results


def _state_matches(fsdp_state, ref_state, key):
    """The consolidated FSDP2 state (the ZeRO-2 layout, rank by rank) is the one-process state (not consolidated for
    the Mixtral: None)."""
    if fsdp_state is None:
        return
    assert fsdp_state.keys() == ref_state.keys(), key
    for i, st in fsdp_state.items():
        for name, v in st.items():
            r = ref_state[i][name]
            assert v == r if name == "step" else torch.allclose(v, r, rtol=1e-4, atol=1e-6), (key, i, name)


def _held_by_the_rule(helpers, r, world):
    """Each rank's parameter and gradient bytes are benchmarks/optim_memory.py's FSDP2 rule (1/W of each, by rows),
    the rule that docs/distributed.md's per-GPU table is computed from."""
    rule = helpers.optim_memory_benchmark().fsdp_bytes_per_rank(r["shapes"], world)
    assert r["held"] == [[b, b] for b in rule]


def test_two_ranks_bit_identical_to_one_process(helpers, same_numbers):
    """W = 2, no clipping: every parameter of G0, G5, the Llama, the Mixtral (experts updated where they are) and the
    split Phi3, in both recipes, equals one process's bits (also where the optimizer was built before the model was
    sharded, as under Accelerate's FSDP2); each rank holds the parameter and gradient bytes of the layout rule."""
    for key, r in same_numbers(2).items():
        _held_by_the_rule(helpers, r, 2)
        worst = max(r["fsdp"], key=r["fsdp"].get)
        assert r["exact"], f"{key}: {worst} differs by {r['fsdp'][worst]:.3g} relative"
        _state_matches(*r["state"], key)


def test_four_ranks_with_clipping_within_summation_order(helpers, same_numbers):
    """W = 4, clipping at 0.3: every tensor within 1e-6 relative of one process, or within 4 times what another
    summation order of the micro-batches moves it in one process; the clipped norms agree to float32 rounding."""
    for key, r in same_numbers(4).items():
        _held_by_the_rule(helpers, r, 4)
        for name, diff in r["fsdp"].items():
            bound = max(1e-6, 4 * r["order"][name])
            assert diff <= bound, f"{key} {name}: {diff:.3g} relative, bound {bound:.3g}"
        ours, ref = r["grad_norm"]
        assert ref > 0.3 and abs(ours - ref) <= 2e-6 * ref, (key, ours, ref)
        _state_matches(*r["state"], key)
