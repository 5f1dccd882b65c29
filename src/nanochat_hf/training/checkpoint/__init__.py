"""Checkpointing in one place.

- `layout`: every file name of output_dir and of its checkpoint-<step> folders, and the `checkpoint-N` pattern.
- `files`: writing and reading the pieces (optimizer shards, RNG states), file modes, a full disk as one line.
- `check`: verifying a checkpoint, picking the one to resume, the world-size check, the run fingerprint.
- `output_dir`: output_dir before training (writable, not another run's, held by a lock) and the final save's
  staging.

`MidTrainer` (trainer.py) writes and reads checkpoints through these; `run.py` resolves and checks the resume.
"""
