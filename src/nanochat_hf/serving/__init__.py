"""An OpenAI-compatible chat endpoint for nanochat-hf models, served by transformers' own server (``transformers
serve``'s FastAPI app, model manager, generation thread and continuous batching), with nanochat's chat format,
stop tokens and calculator tool. Start it with ``python -m nanochat_hf.serving MODEL_DIR`` (docs/serving.md).

Light on purpose: the command parses its arguments before torch and transformers are imported (see ``cli``)."""
