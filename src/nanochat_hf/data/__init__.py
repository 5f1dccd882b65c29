"""Mid-training data: task mixtures on `datasets` (the tasks themselves: `nanochat_hf.tasks`), tokenization, packing
per rank, and the offline demo; pretraining's shards and rows: `pretraining.py`.

Mixture rows: ``{"conversation": str (JSON of nanochat's {"messages": [...]}), "task": str}``;
tokenized rows: ``{"input_ids", "labels", "num_tokens", "task"}``.
"""

from __future__ import annotations

from ..lazy import lazy_exports

# name -> the submodule defining it, imported on first use (PEP 562): the task registry, which every command's
# --help reads, imports the light modules (words, conversation) without the tokenization and packing stack
_WHERE = {
    "BestFitStream": "bestfit",
    "check_messages": "conversation",
    "conversation_texts": "conversation",
    "dumps": "conversation",
    "loads": "conversation",
    "demo_tokenizer": "demo",
    "DEMO_MIXTURE": "mixture",
    "TaskSpec": "mixture",
    "load_mixture": "mixture",
    "parse_mixture": "mixture",
    "read_mixture": "mixture",
    "MicroBatchStream": "packing",
    "PackedStream": "packing",
    "PretrainStream": "pretraining",
    "write_synthetic_shards": "pretraining",
    "tokenize_conversations": "tokenization",
    "WORD_LISTS": "words",
    "demo_words": "words",
    "english_words": "words",
    "word_list": "words",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "DEMO_MIXTURE",
    "WORD_LISTS",
    "BestFitStream",
    "MicroBatchStream",
    "PackedStream",
    "PretrainStream",
    "TaskSpec",
    "check_messages",
    "conversation_texts",
    "demo_tokenizer",
    "demo_words",
    "dumps",
    "english_words",
    "load_mixture",
    "loads",
    "parse_mixture",
    "read_mixture",
    "tokenize_conversations",
    "word_list",
    "write_synthetic_shards",
]
