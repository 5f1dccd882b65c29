"""The one private GRPOTrainer hook NanoChatGRPOTrainer overrides, pinned: TRL's `_prepare_inputs` is where it
shuffles the generation batch before splitting it into micro-batches (our override splits it unshuffled, so a
micro-batch is one pass of one prompt). If TRL moves the shuffle or renames the hook, this fails first; the
parity test (test_chat_rl_parity.py) shows the effect: every pass's loss is chat_rl.py's."""

import inspect

from trl import GRPOTrainer

from nanochat_hf.rl.trainer import NanoChatGRPOTrainer


def test_trl_shuffles_in_prepare_inputs_and_we_override_it():
    source = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "shuffle_sequence_dict(generation_batch)" in source
    assert "split_tensor_dict(generation_batch, self.args.steps_per_generation)" in source
    assert "_generate_and_score_completions(generation_batch)" in source
    assert NanoChatGRPOTrainer._prepare_inputs is not GRPOTrainer._prepare_inputs
