"""nanochat's RL stage on TRL's GRPOTrainer: `accelerate launch scripts/chat_rl.py configs/rl_nanochat.yaml
--model_source <dir>`. See `RLArguments` (src/nanochat_hf/rl/arguments.py) for every flag, docs/rl.md for the rest.
"""

import sys

from nanochat_hf.rl.run import main

if __name__ == "__main__":
    sys.exit(main())
