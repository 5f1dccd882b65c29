"""An SFT on a nanochat base folder as chat_sft.py does it, by default: the base run's optimizer files are loaded,
with the base run's group settings (its last Muon weight decay) and only the LRs reset, from the files of any number
of processes; files of another model, or a set with a rank's file missing, stop the run in one line naming the file,
with nothing written. The result goes back to nanochat with
the meta chat_sft.py writes. `slow`: every test trains a step or builds a G5 base with its optimizer files (seconds)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from nanochat_hf.conversion import to_nanochat
from nanochat_hf.training.run import main

from .test_nanochat_generations import write_g5_base

pytestmark = pytest.mark.slow

HEAD_FILE = Path(__file__).parents[1] / "optim" / "data" / "optim_000005_rank0.pt"  # nanochat's, of another model
RUN = [
    "--trust_pickle",
    "true",
    "--optimizer_recipe",
    "2026-07",
    "--num_iterations",
    "1",
    "--max_seq_len",
    "64",
    "--device_batch_size",
    "2",
    "--total_batch_size",
    "128",
    "--eval_every",
    "-1",
    "--eval_tokens",
    "128",
    "--spelling_eval_rows",
    "0",
    "--chat_eval_tasks",
    "",
    "--report_to",
    "none",
    "--disable_tqdm",
    "true",
    "--torch_compile",
    "false",
]


@pytest.fixture(scope="module")
def base_with_optimizer(tmp_path_factory) -> Path:
    """A G5 base folder as nanochat HEAD's base_train leaves it, optim_000010_rank0.pt included (HEAD's format,
    after one step, Muon weight decay 0.125: what base_train's cosine schedule had reached)."""
    from nanochat_hf.conversion import load_from_nanochat
    from nanochat_hf.conversion.optimizer_files import nanochat_files
    from nanochat_hf.integration.optimizer_state import full_state
    from nanochat_hf.optim import build_optimizer

    base = tmp_path_factory.mktemp("warm") / "nanochat"
    write_g5_base(base)
    checkpoint = base / "base_checkpoints" / "d2"
    meta_path = checkpoint / "meta_000010.json"  # base_train's fields: its window pattern "SSSL" gives S, L here
    meta = json.loads(meta_path.read_text())
    meta["model_config"]["window_pattern"] = "SSSL"
    meta.update(val_bpb=1.25, user_config={"depth": 2, "window_pattern": "SSSL"}, loop_state={"min_val_bpb": 1.25})
    meta_path.write_text(json.dumps(meta, indent=2))
    model, _ = load_from_nanochat(checkpoint, base / "tokenizer", trust_pickle=True)
    opt = build_optimizer(model, recipe="2026-07", weight_decay=0.125)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    full = full_state(opt, model)
    dtypes = {n: torch.float32 for n, _ in model.named_parameters()}
    [one] = nanochat_files(model, full, 1, "head", dtypes, opt.param_groups)
    torch.save(one, checkpoint / "optim_000010_rank0.pt")
    (base.parent / "two").mkdir()  # the file set a 2-process run writes
    for r, obj in enumerate(nanochat_files(model, full, 2, "head", dtypes, opt.param_groups)):
        torch.save(obj, base.parent / "two" / f"optim_000010_rank{r}.pt")
    return base


def test_the_base_runs_optimizer_is_loaded_and_the_meta_goes_back_out(base_with_optimizer, tmp_path, capsys):
    """The warm start says so in the run's first lines, with the weight decay it carries; to-nanochat then writes
    the meta chat_sft.py writes (its save_checkpoint call: step, val_bpb, model_config, user_config): this run's
    step, val bpb and arguments, the base's window_pattern "SSSL"; none of base_train's keys for resuming the base
    run (loop_state, dataloader_state_dict, its batch sizes)."""
    main([*RUN, "--model_source", str(base_with_optimizer), "--output_dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    checkpoint = base_with_optimizer / "base_checkpoints" / "d2"
    optim = checkpoint / "optim_000010_rank0.pt"
    assert out.splitlines()[0] == (
        f"mid_train: warm-starting the optimizer from {optim} as chat_sft.py does (--load_optimizer false: a fresh one)"
    )
    assert "LRs from this run; Muon weight decay 0.125 from the base run" in out
    sft = tmp_path / "nanochat" / "chatsft_checkpoints" / "d2"
    to_nanochat(tmp_path / "out", sft)
    base_meta = json.loads((checkpoint / "meta_000010.json").read_text())
    val_bpb = float(re.search(r"validation bpb: ([0-9.]+)", out).group(1))
    meta = json.loads((sft / "meta_000001.json").read_text())
    assert list(meta) == ["step", "val_bpb", "model_config", "user_config"]  # chat_sft.py's, in its order
    assert meta["step"] == 1 and meta["val_bpb"] == pytest.approx(val_bpb, abs=1e-4)
    assert meta["model_config"] == base_meta["model_config"]  # window_pattern "SSSL" included
    user_config = meta["user_config"]  # this run's arguments (chat_sft.py: its own), not base_train's
    assert [user_config[k] for k in ("max_seq_len", "device_batch_size", "total_batch_size")] == [64, 2, 128]
    assert user_config["optimizer_recipe"] == "2026-07" and user_config != base_meta["user_config"]


def test_a_file_set_of_two_processes_warm_starts_one_process(base_with_optimizer, tmp_path):
    """nanochat's files of a 2-process run (the same state, sharded) warm-start a 1-process run exactly as the
    1-process file does: the trained weights are bit-identical."""
    from safetensors.torch import load_file

    two = tmp_path / "nanochat"
    shutil.copytree(base_with_optimizer, two)
    for r in range(2):
        shutil.copy(base_with_optimizer.parent / "two" / f"optim_000010_rank{r}.pt", two / "base_checkpoints" / "d2")
    weights = []
    for name, base in (("one", base_with_optimizer), ("two", two)):
        main([*RUN, "--model_source", str(base), "--output_dir", str(tmp_path / name)])
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.parametrize("case", ["another model", "a rank's file missing"])
def test_foreign_optimizer_files_are_one_line_and_nothing_is_written(base_with_optimizer, tmp_path, capsys, case):
    base = tmp_path / "nanochat"
    shutil.copytree(base_with_optimizer, base)
    checkpoint = base / "base_checkpoints" / "d2"
    if case == "another model":
        shutil.copy(HEAD_FILE, checkpoint / "optim_000010_rank0.pt")
        expected = "optim_000010_rank0.pt: its optimizer groups"
    else:  # ranks 0 and 2 of a file set
        shutil.copy(base_with_optimizer.parent / "two" / "optim_000010_rank1.pt", checkpoint / "optim_000010_rank2.pt")
        expected = "optim_000010_rank1.pt: missing (found ranks [0, 2]"
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*RUN, "--model_source", str(base), "--output_dir", str(out)])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mid_train: error:")]
    assert len(errors) == 1 and expected in errors[0], errors
    assert not out.exists()
