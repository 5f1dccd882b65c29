"""The pieces of a checkpoint (RNG states) round-trip exactly (safetensors + JSON, no pickles), and a full disk
during a save is one line with what was staged undone."""

import random

import numpy as np
import pytest
import torch

from nanochat_hf.training.checkpoint.files import (
    DiskFullError,
    disk_full_as_one_line,
    load_rng_state,
    save_rng_state,
)


def test_rng_roundtrip(tmp_path):
    save_rng_state(tmp_path, 0)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)
    load_rng_state(tmp_path, 0)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_a_full_disk_is_one_line_and_undone(tmp_path):
    import resource

    from safetensors.torch import save_file

    undone = []
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))
    try:  # safetensors' own error type (SafetensorError "... (os error 27)"), and a plain OSError
        with (
            pytest.raises(DiskFullError) as err,
            disk_full_as_one_line("checkpoint x", tmp_path, 3 << 20, lambda: undone.append(1)),
        ):
            save_file({"w": torch.zeros(1 << 16)}, str(tmp_path / "w.safetensors"))
        with pytest.raises(DiskFullError), disk_full_as_one_line("x", tmp_path, 1, lambda: undone.append(2)):
            (tmp_path / "big").write_bytes(b"x" * (1 << 17))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(err.value)
    assert (
        message.startswith(
            f"checkpoint x could not be saved in {tmp_path}: a file would exceed the file-size "
            "limit (ulimit -f); it needs about 3.0 MB free there ("
        )
        and "\n" not in message
    )
    assert undone == [1, 2]
    with pytest.raises(ValueError, match="other"), disk_full_as_one_line("x", tmp_path, 1, lambda: undone.append(3)):
        raise ValueError("other")  # any other error passes through, nothing undone
    assert undone == [1, 2]
