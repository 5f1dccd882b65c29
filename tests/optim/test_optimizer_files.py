"""nanochat's optimizer files (G0-era list and HEAD MuonAdamW formats) into our optimizer, and written back."""

import shutil
from pathlib import Path

import pytest
import torch

from nanochat_hf.conversion.optimizer_files import (
    load_nanochat_optimizer,
    nanochat_files,
    read_nanochat_optimizer,
)
from nanochat_hf.integration.optimizer_state import full_state
from nanochat_hf.optim import build_optimizer

DATA = Path(__file__).parent / "data"
HEAD_FILE, G0_FILE = DATA / "optim_000005_rank0.pt", DATA / "optim_000003_rank0.pt"


def g0_model():
    """Our model with the shapes of the G0 model make_g0_optim.py built (its values do not matter here)."""
    from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

    return NanoChatGPTForCausalLM(
        NanoChatGPTConfig(sequence_len=16, vocab_size=64, n_layer=3, n_head=2, n_kv_head=1, n_embd=32)
    )


def _same_state(a, b):
    """Two nanochat optimizer state_dicts hold the same tensors (dtype included) and the same group layout."""
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys(), i
        for k, v in a["state"][i].items():
            w = b["state"][i][k]
            assert (torch.equal(v, w) and v.dtype == w.dtype) if torch.is_tensor(v) else v == w, (i, k)
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]


def test_head_file_warm_start_continues_nanochat(helpers):
    """nanochat's own file after 5 steps: loading it gives our optimizer the state of our own 5 steps, so the
    6th step equals continuing; LRs stay the run's; written back it is nanochat's file again, tensor for tensor."""
    initial, grads, final, _ = helpers.head_reference()
    ours = helpers.named_module(initial, 32)
    opt = build_optimizer(ours, **helpers.HEAD_RATES, recipe="2026-07")
    helpers.head_steps(ours, opt, grads)
    warm = helpers.named_module(final, 32)
    warm_opt = build_optimizer(warm, **helpers.HEAD_RATES, recipe="2026-07")
    lrs = [g["lr"] for g in warm_opt.param_groups]
    message = load_nanochat_optimizer(warm_opt, warm, HEAD_FILE)
    assert "head format" in message and [g["lr"] for g in warm_opt.param_groups] == lrs
    assert "Muon weight decay 0.2 from the base run" in message
    for (i, st), (j, ref) in zip(
        sorted(warm_opt.state_dict()["state"].items()), sorted(opt.state_dict()["state"].items())
    ):
        assert i == j and st.keys() == ref.keys()
        for k in st:
            if k == "step":
                assert st[k] == ref[k] == 5
            else:  # float32 rounding, as in test_head_recipe
                assert (st[k] - ref[k]).abs().max() <= 1e-5 * ref[k].abs().max(), (i, k)
    with torch.no_grad():
        for p, q in zip(ours.parameters(), warm.parameters()):
            p.copy_(q)  # the same starting point, so that only the optimizer states differ
    helpers.head_steps(ours, opt, grads[:1])
    helpers.head_steps(warm, warm_opt, grads[:1])
    for (n, p), q in zip(ours.named_parameters(), warm.parameters()):
        assert (p - q).abs().max() <= 1e-5 * p.abs().max(), n
    nanochat = torch.load(HEAD_FILE, weights_only=True)
    full, world, fmt = read_nanochat_optimizer(HEAD_FILE, warm)
    dtypes = {n: torch.float32 for n, _ in warm.named_parameters()}
    again = nanochat_files(warm, full, world, fmt, dtypes, warm_opt.param_groups)[0]
    _same_state(again, nanochat)
    # and from our own optimizer's state dict (what the trainer saves): the same file
    ours_full = full_state(opt, ours)
    assert ours_full.keys() == full.keys()


def test_head_file_settings_carry_over_but_the_learning_rates(helpers):
    """chat_sft.py: load_state_dict brings back every group setting of the base run's file, then only the LRs are
    reset. A fresh optimizer built with weight decay 0 gets the file's Muon weight decay (0.2 there) and momentum;
    the December recipe's groups are not nanochat HEAD's, so only the state moves there."""
    initial, _, _, _ = helpers.head_reference()
    model = helpers.named_module(initial, 32)
    opt = build_optimizer(model, **{**helpers.HEAD_RATES, "weight_decay": 0.0}, recipe="2026-07")
    lrs = [(g["lr"], g["initial_lr"]) for g in opt.param_groups]
    load_nanochat_optimizer(opt, model, HEAD_FILE)
    saved = torch.load(HEAD_FILE, weights_only=True)["param_groups"]
    muon = [g for g in saved if g["kind"] == "muon"]
    assert {g["weight_decay"] for g in muon} == {0.2}
    for group in opt.param_groups:
        if group["kind"] == "muon":
            assert (group["weight_decay"], group["momentum"]) == (0.2, muon[0]["momentum"])
    assert [(g["lr"], g["initial_lr"]) for g in opt.param_groups] == lrs
    december_model = helpers.named_module(initial, 32)
    december = build_optimizer(december_model, **{**helpers.HEAD_RATES, "weight_decay": 0.0})
    message = load_nanochat_optimizer(december, december_model, HEAD_FILE)
    assert "weight decay" not in message and {g.get("weight_decay", 0.0) for g in december.param_groups} == {0.0}


def test_g0_file_into_either_recipe(tmp_path):
    """A G0-era file (nanochat 790f3be, one process): momentum buffers and AdamW moments by parameter name into the
    December optimizer (and back to the same file), and into recipe 2026-07 (stacked; no second moment yet)."""
    model = g0_model()
    nanochat = torch.load(G0_FILE, weights_only=True)
    full, world, fmt = read_nanochat_optimizer(G0_FILE, model)
    assert (world, fmt) == (1, "g0") and len(full) == 20
    dec = build_optimizer(model)
    load_nanochat_optimizer(dec, model, G0_FILE)
    names = {id(p): n for n, p in model.named_parameters()}
    lm_head = model.lm_head.weight
    assert torch.equal(dec.state[lm_head]["exp_avg"], nanochat[0]["state"][0]["exp_avg"])
    assert dec.state[lm_head]["step"] == 3 and dec.param_groups[0]["lr"] == dec.param_groups[0]["initial_lr"]
    c_fc = model.transformer.h[1].mlp.c_fc.weight
    assert torch.equal(dec.state[c_fc]["momentum_buffer"], full[names[id(c_fc)]]["momentum_buffer"])
    back = full_state(dec, model)
    files = nanochat_files(model, back, 1, "g0", {n: torch.float32 for n in full}, dec.param_groups)[0]
    for ours, theirs in zip(files, nanochat):
        _same_state(ours, theirs)
    head = build_optimizer(model, recipe="2026-07")
    load_nanochat_optimizer(head, model, G0_FILE)
    group = next(g for g in head.param_groups if g["name"] == "muon/128x32")
    st = head.state[group["params"][0]]
    assert torch.equal(st["momentum_buffer"][1], full[names[id(c_fc)]]["momentum_buffer"])
    assert not st["second_momentum_buffer"].any()


def test_bad_files_are_refused_in_one_line(tmp_path, helpers):
    """Another generation, another model, another world size, a damaged file: one line naming the file, and the
    optimizer left as it was."""
    model = g0_model()
    opt = build_optimizer(model, recipe="2026-07")
    with pytest.raises(
        ValueError,
        match=r"optim_000005_rank0.pt: its optimizer groups .* a file of another model "
        "or generation",
    ) as e:
        load_nanochat_optimizer(opt, model, HEAD_FILE)  # a G5 file, a G0 model
    assert "\n" not in str(e.value) and not opt.state
    bigger = helpers.tiny_model(vocab_size=64)  # other widths
    with pytest.raises(ValueError, match=r"optim_000003_rank0.pt: .*(another model|parameters)"):
        load_nanochat_optimizer(build_optimizer(bigger), bigger, G0_FILE)
    for r in range(2):  # a one-process file under two ranks' names: another world size
        shutil.copy(G0_FILE, tmp_path / f"optim_000003_rank{r}.pt")
    with pytest.raises(ValueError, match=r"optim_000003_rank0.pt: written by one process but the folder holds 2"):
        load_nanochat_optimizer(build_optimizer(model), model, tmp_path / "optim_000003_rank1.pt")
    (tmp_path / "optim_000007_rank0.pt").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"optim_000007_rank0.pt: not a readable optimizer file"):
        load_nanochat_optimizer(opt, model, tmp_path / "optim_000007_rank0.pt")
    (tmp_path / "optim_000009_rank1.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"optim_000009_rank0.pt: missing"):
        load_nanochat_optimizer(opt, model, tmp_path / "optim_000009_rank1.pt")
    assert not opt.state


@pytest.mark.parametrize("fmt", ["head", "g0"])
def test_two_rank_file_sets_round_trip(helpers, tmp_path, fmt):
    """Files for 2 processes, in nanochat's sharded layouts (HEAD: contiguous chunks of each stack, rows of the
    large AdamW parameters; G0: DistMuon's matrix i on rank i % 2, DistAdamW's rows): read back, the same state,
    which also warm-starts one process."""
    if fmt == "head":
        initial, grads, _, _ = helpers.head_reference()
        model = helpers.named_module(initial, 32)
        opt = build_optimizer(model, **helpers.HEAD_RATES, recipe="2026-07")
        helpers.head_steps(model, opt, grads[:2])
        full = full_state(opt, model)
    else:
        model = g0_model()
        full, _, _ = read_nanochat_optimizer(G0_FILE, model)
        opt = build_optimizer(model)
    dtypes = {n: torch.float32 for n, _ in model.named_parameters()}
    files = nanochat_files(model, full, 2, fmt, dtypes, opt.param_groups)
    for r, obj in enumerate(files):
        torch.save(obj, tmp_path / f"optim_000002_rank{r}.pt")
    back, world, got_fmt = read_nanochat_optimizer(tmp_path / "optim_000002_rank0.pt", model)
    assert (world, got_fmt) == (2, fmt) and back.keys() == full.keys()
    for n, st in full.items():
        assert back[n].keys() == st.keys(), n
        for k, v in st.items():
            assert v == back[n][k] if k == "step" else torch.equal(v, back[n][k]), (n, k)
    # and the 2-process set warm-starts a 1-process optimizer with that same state
    load_nanochat_optimizer(opt, model, tmp_path / "optim_000002_rank0.pt")
    got = full_state(opt, model)
    assert all(torch.equal(got[n][k], v) for n, st in full.items() for k, v in st.items() if k != "step")
