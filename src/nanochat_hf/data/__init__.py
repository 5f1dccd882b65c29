"""Mid-training data: task mixtures on `datasets` (the tasks themselves: `nanochat_hf.tasks`), tokenization, packing
per rank, and the offline demo.

Mixture rows: ``{"conversation": str (JSON of nanochat's {"messages": [...]}), "task": str}``;
tokenized rows: ``{"input_ids", "labels", "num_tokens", "task"}``.
"""

from .bestfit import BestFitStream
from .conversation import check_messages, conversation_texts, dumps, loads
from .demo import demo_tokenizer
from .mixture import DEMO_MIXTURE, TaskSpec, load_mixture, parse_mixture, read_mixture
from .packing import MicroBatchStream, PackedStream
from .tokenization import tokenize_conversations
from .words import WORD_LISTS, demo_words, english_words, word_list

__all__ = [
    "DEMO_MIXTURE",
    "WORD_LISTS",
    "BestFitStream",
    "MicroBatchStream",
    "PackedStream",
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
]
