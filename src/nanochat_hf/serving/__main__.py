"""``python -m nanochat_hf.serving MODEL_DIR``: see ``cli``."""

import sys

from nanochat_hf.serving.cli import main

sys.exit(main())
