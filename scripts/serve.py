"""Serve a nanochat-hf model with an OpenAI-compatible chat endpoint: the same as ``python -m nanochat_hf.serving``
(see src/nanochat_hf/serving/cli.py and docs/serving.md).

    python scripts/serve.py MODEL_DIR [--port 8000] [--api-key KEY]
"""

import sys

from nanochat_hf.serving.cli import main

if __name__ == "__main__":
    sys.exit(main())
