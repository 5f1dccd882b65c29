"""Every file name of a run's output_dir and of its checkpoint-<step> folders, spelled here once.

output_dir/
  _mid_train.lock             held (flock) while a run uses output_dir
  checkpoint-<step>/          every --save_steps: the stock Trainer._save_checkpoint calls MidTrainer's hooks
    model files               config.json, model.safetensors (or an index and the shards it lists),
                              generation_config.json, tokenizer files, training_args.json
    scheduler.json, nanochat_state.json, run_fingerprint.json
    per process r             optimizer.rank<r>.safetensors (read by a run of any size: integration/optimizer_state.py),
                              rng_state.rank<r>.safetensors + rng_state.rank<r>.json
    per data shard s          data_state.rank<s>.json (the shards: the processes the run started with,
                              data/shards.py; nanochat_state.json says how many)
    trainer_state.json        written last, once every rank is done: a folder with it is complete
  model files                 the final save (staged inside output_dir, then moved in file by file)
  trainer_state.json, README.md (model card), report.md
"""

from __future__ import annotations

import os
import re

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...integration.optimizer_state import OPTIMIZER_FILE, SCHEDULER_FILE  # their owner: the optimizer's format

# checkpoint-<step>: the stock `Trainer._save_checkpoint` names the folders
CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")

# transformers' model files (save_pretrained shards a large model: an index plus the shards it lists)
CONFIG_FILE = "config.json"
MODEL_FILE, MODEL_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED_MODEL_FILE = "pytorch_model.bin"  # never written by us; another tool's run in output_dir
TRAINING_ARGS_FILE = "training_args.json"  # the arguments as JSON (the stock training_args.bin is a pickle)
TRAINER_STATE_FILE = "trainer_state.json"

# our pieces of a checkpoint; {rank}: one file per process
STATE_FILE = "nanochat_state.json"  # world size, data shards, the logger's state, the best val bpb
FINGERPRINT_FILE = "run_fingerprint.json"  # what must not change when resuming (check.run_fingerprint)
DATA_STATE_FILE = "data_state.rank{rank}.json"  # a data shard's position
RNG_TENSORS_FILE = "rng_state.rank{rank}.safetensors"
RNG_STATE_FILE = "rng_state.rank{rank}.json"

# what a resumable checkpoint must hold besides the model weights
SHARED_FILES = (CONFIG_FILE, SCHEDULER_FILE, STATE_FILE, FINGERPRINT_FILE, TRAINER_STATE_FILE)
PER_PROCESS_FILES = (OPTIMIZER_FILE, RNG_TENSORS_FILE, RNG_STATE_FILE)
PER_SHARD_FILES = (DATA_STATE_FILE,)

# the run's own files in output_dir
REPORT_FILE = "report.md"
CURVES_FILE = "training_curves.png"  # the plot report.md shows
MODEL_CARD_FILE = "README.md"
LOCK_FILE = "_mid_train.lock"  # "_*": never pushed to the hub by Trainer.push_to_hub
# files whose presence means output_dir already holds a (finished or partial) run
RUN_FILES = (MODEL_FILE, MODEL_INDEX, PICKLED_MODEL_FILE, REPORT_FILE)


def checkpoint_name(step: int) -> str:
    return f"{PREFIX_CHECKPOINT_DIR}-{step}"


def replaced_name(checkpoint: str) -> str:
    """Where a checkpoint folder of the same step waits while its replacement is written (removed once complete)."""
    return f".replaced-{checkpoint}-{os.getpid()}"
