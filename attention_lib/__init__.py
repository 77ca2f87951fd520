"""Attention from Scratch: the finished code of the book.

Each chapter of the book builds one piece of this package step by step in plain
PyTorch, then imports the finished piece from here and checks that it gives the
same numbers. Every public function names, in its docstring, the chapter that
explains it.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# --- core: masks, scaled dot-product attention, multi-head attention (chapters 2-6)
from .masks import as_keep_mask, causal_mask, masked_softmax, padding_mask  # noqa: E402
from .sdpa import scaled_dot_product_attention  # noqa: E402
from .backends import available_backends  # noqa: E402
from .mha import MultiHeadAttention  # noqa: E402

__all__ += [
    "causal_mask",
    "padding_mask",
    "as_keep_mask",
    "masked_softmax",
    "scaled_dot_product_attention",
    "available_backends",
    "MultiHeadAttention",
]

# --- the display kit: heatmaps and slider explorers (used by every chapter)
from .show.explorer import SliderExplorer, explore  # noqa: E402
from .show.style import smallest_text_px, use_book_style  # noqa: E402
from .show.viz import attention_grid, attention_heatmap  # noqa: E402

__all__ += [
    "attention_heatmap",
    "attention_grid",
    "explore",
    "SliderExplorer",
    "use_book_style",
    "smallest_text_px",
]

# --- efficient attention: online softmax and tiled attention (chapter 8)
from .tiled import (  # noqa: E402
    OnlineSoftmaxState,
    online_softmax,
    online_softmax_update,
    tiled_attention,
)

__all__ += ["online_softmax", "online_softmax_update", "OnlineSoftmaxState", "tiled_attention"]

# --- counting tensor memory (chapter 8)
from .memory import TensorMemory  # noqa: E402

__all__ += ["TensorMemory"]

# --- a small Transformer encoder and a toy task (chapter 7)
from .encoder import (  # noqa: E402
    Encoder,
    EncoderLayer,
    FeedForward,
    SinusoidalPositionalEncoding,
    TokenClassifier,
    sinusoidal_positional_encoding,
)
from .tasks import (  # noqa: E402
    TASKS,
    TrainingHistory,
    count_shared_sequences,
    ideal_attention_share,
    ideal_key_positions,
    make_task_data,
    token_accuracy,
    train_token_classifier,
)

__all__ += [
    "sinusoidal_positional_encoding",
    "SinusoidalPositionalEncoding",
    "FeedForward",
    "EncoderLayer",
    "Encoder",
    "TokenClassifier",
    "TASKS",
    "make_task_data",
    "ideal_key_positions",
    "ideal_attention_share",
    "count_shared_sequences",
    "token_accuracy",
    "TrainingHistory",
    "train_token_classifier",
]

# --- a causal language model, its KV cache and generation (chapter 9)
from .kv_cache import KVCache, LayerKVCache  # noqa: E402
from .causal_lm import CausalLM  # noqa: E402
from .generation import generate  # noqa: E402
from .induction import (  # noqa: E402
    make_induction_data,
    predictable_accuracy,
    predictable_positions,
)

__all__ += [
    "KVCache",
    "LayerKVCache",
    "CausalLM",
    "generate",
    "make_induction_data",
    "predictable_positions",
    "predictable_accuracy",
]

# --- attention in today's LLMs: RoPE, GQA/MQA, KV-cache memory (chapter 10)
from .kv_memory import PUBLISHED_SHAPES, ModelShape, kv_cache_bytes, kv_cache_table  # noqa: E402
from .rope import apply_rope, rope_frequencies, rope_permutation  # noqa: E402

__all__ += [
    "apply_rope",
    "rope_frequencies",
    "rope_permutation",
    "ModelShape",
    "PUBLISHED_SHAPES",
    "kv_cache_bytes",
    "kv_cache_table",
]
