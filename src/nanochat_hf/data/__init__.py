"""Mid-training data: task mixtures on `datasets`, tokenization, packing per rank, and the offline demo.

Mixture rows: ``{"conversation": str (JSON of nanochat's {"messages": [...]}), "task": str}``;
tokenized rows: ``{"input_ids", "labels", "num_tokens", "task"}``.
"""

from .bestfit import BestFitStream
from .conversation import check_messages, conversation_texts, dumps, loads
from .demo import demo_tokenizer
from .mixture import DEMO_MIXTURE, load_mixture, parse_mixture, read_mixture
from .packing import MicroBatchStream, PackedStream
from .tasks import TASK_NAMES, TaskSpec, gsm8k_parts, render_mc
from .tokenization import tokenize_conversations
from .words import WORD_LISTS, demo_words, english_words, word_list

__all__ = [
    "DEMO_MIXTURE",
    "TASK_NAMES",
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
    "gsm8k_parts",
    "load_mixture",
    "loads",
    "parse_mixture",
    "read_mixture",
    "render_mc",
    "tokenize_conversations",
    "word_list",
]
