"""`CheckpointHubPush`, the callback that pushes each saved checkpoint (`--push_to_hub`), without a hub: the uploads
it starts are recorded (their futures are ours to finish), the stock push's rules checked one by one. The real
round trip against a local hub server is test_hub.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi
from huggingface_hub.utils import filter_repo_objects
from transformers.trainer_utils import HubStrategy

from nanochat_hf.training.callbacks import CheckpointHubPush

# what a one-process checkpoint folder holds
CHECKPOINT_FILES = [
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "modeling_nanochat_gpt.py",
    "configuration_nanochat_gpt.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "training_args.json",
    "optimizer.rank0.safetensors",
    "rng_state.rank0.safetensors",
    "rng_state.rank0.json",
    "data_state.rank0.json",
    "scheduler.json",
    "nanochat_state.json",
    "run_fingerprint.json",
    "trainer_state.json",
]


@pytest.fixture
def pushes(monkeypatch):
    calls: list[dict] = []

    def upload_folder(self, **kwargs):
        assert kwargs["run_as_future"] is True  # in the background, as the stock push
        calls.append({**kwargs, "future": Future()})
        return calls[-1]["future"]

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def _push(strategy=HubStrategy.EVERY_SAVE, always=False):
    begun: list[int] = []
    trainer = SimpleNamespace(
        hub_model_id="alice/tiny",
        callback_handler=SimpleNamespace(on_push_begin=lambda args, state, control: begun.append(state.global_step)),
    )
    args = SimpleNamespace(
        hub_strategy=strategy, hub_always_push=always, output_dir="/runs/out", hub_token=None, hub_revision="dev"
    )
    callback = CheckpointHubPush(trainer)

    def save(step: int, rank0: bool = True) -> None:
        callback.on_save(args, SimpleNamespace(global_step=step, is_world_process_zero=rank0), None)

    return callback, save, begun


def test_model_files_from_the_checkpoint_folder_and_the_folder_itself(pushes):
    callback, save, begun = _push(HubStrategy.CHECKPOINT)
    save(3)
    assert begun == [3] and len(pushes) == 2
    model, folder = pushes
    assert str(model["folder_path"]) == "/runs/out/checkpoint-3" and model["repo_id"] == "alice/tiny"
    assert model["revision"] == "dev" and "path_in_repo" not in model
    picked = set(
        filter_repo_objects(
            CHECKPOINT_FILES, allow_patterns=model["allow_patterns"], ignore_patterns=model["ignore_patterns"]
        )
    )
    assert picked == set(CHECKPOINT_FILES[:10])  # the model files only, no checkpoint piece
    assert folder["path_in_repo"] == "last-checkpoint" and "allow_patterns" not in folder
    assert folder["commit_message"] == "Training in progress, step 3, checkpoint"


def test_all_checkpoints_each_under_its_name_and_every_save_the_model_only(pushes):
    _, save, _ = _push(HubStrategy.ALL_CHECKPOINTS)
    save(5)
    assert pushes[1]["path_in_repo"] == "checkpoint-5"
    pushes.clear()
    _, save, _ = _push(HubStrategy.EVERY_SAVE)
    save(5)
    assert len(pushes) == 1 and pushes[0]["commit_message"] == "Training in progress, step 5"


def test_a_push_still_running_skips_the_next_unless_hub_always_push(pushes):
    callback, save, begun = _push()
    save(1)
    save(2)  # the first upload is still running: no push
    assert begun == [1] and len(pushes) == 1
    pushes[0]["future"].set_result(None)
    save(3)
    assert begun == [1, 3] and len(pushes) == 2 and callback.jobs == [pushes[1]["future"]]  # finished jobs dropped

    pushes.clear()
    callback, save, begun = _push(always=True)
    save(1)
    save(2)
    assert begun == [1, 2] and len(callback.jobs) == 2


def test_no_push_from_other_ranks_nor_with_hub_strategy_end(pushes):
    _, save, _ = _push()
    save(1, rank0=False)
    _, save, _ = _push(HubStrategy.END)
    save(1)
    assert pushes == []


def test_the_end_of_training_waits_for_the_uploads(pushes):
    callback, save, _ = _push(HubStrategy.CHECKPOINT)
    save(1)
    for p in pushes:
        p["future"].set_result(None)  # (a future left running would block on_train_end for ever)
    callback.on_train_end(None, None, None)
    assert all(job.done() for job in callback.jobs)
