"""Attention from Scratch: the finished code of the book.

Each chapter of the book builds one piece of this package step by step in plain
PyTorch, then imports the finished piece from here and checks that it gives the
same numbers. Every public function names, in its docstring, the chapter that
explains it.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# --- core: masks, scaled dot-product attention, multi-head attention (chapters 2-6)
from .backends import available_backends
from .masks import as_keep_mask, causal_mask, masked_softmax, padding_mask
from .mha import MultiHeadAttention
from .sdpa import scaled_dot_product_attention

__all__ += [
    "MultiHeadAttention",
    "as_keep_mask",
    "available_backends",
    "causal_mask",
    "masked_softmax",
    "padding_mask",
    "scaled_dot_product_attention",
]

# --- the display kit: heatmaps and slider explorers (used by every chapter)
from .show.explorer import SliderExplorer, explore
from .show.phone import use_book_style
from .show.style import smallest_text_px
from .show.viz import attention_grid, attention_heatmap

__all__ += [
    "SliderExplorer",
    "attention_grid",
    "attention_heatmap",
    "explore",
    "smallest_text_px",
    "use_book_style",
]

# --- efficient attention: online softmax and tiled attention (chapter 11)
from .tiled import (
    OnlineSoftmaxState,
    online_softmax,
    online_softmax_update,
    tiled_attention,
)

__all__ += ["OnlineSoftmaxState", "online_softmax", "online_softmax_update", "tiled_attention"]

# --- counting tensor memory (chapter 11)
from .memory import TensorMemory

__all__ += ["TensorMemory"]

# --- a small Transformer encoder and a toy task (chapter 7)
from .encoder import (
    Encoder,
    EncoderLayer,
    FeedForward,
    SinusoidalPositionalEncoding,
    TokenClassifier,
    sinusoidal_positional_encoding,
)
from .tasks import (
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
    "TASKS",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "SinusoidalPositionalEncoding",
    "TokenClassifier",
    "TrainingHistory",
    "count_shared_sequences",
    "ideal_attention_share",
    "ideal_key_positions",
    "make_task_data",
    "sinusoidal_positional_encoding",
    "token_accuracy",
    "train_token_classifier",
]

# --- a causal language model, its KV cache and generation (chapter 9)
from .causal_lm import CausalLM
from .generation import generate
from .induction import (
    make_induction_data,
    predictable_accuracy,
    predictable_positions,
)
from .kv_cache import KVCache, LayerKVCache

__all__ += [
    "CausalLM",
    "KVCache",
    "LayerKVCache",
    "generate",
    "make_induction_data",
    "predictable_accuracy",
    "predictable_positions",
]

# --- attention in today's LLMs: RoPE, GQA/MQA, KV-cache memory (chapter 10)
from .kv_memory import PUBLISHED_SHAPES, ModelShape, kv_cache_bytes, kv_cache_table
from .rope import apply_rope, rope_frequencies, rope_permutation

__all__ += [
    "PUBLISHED_SHAPES",
    "ModelShape",
    "apply_rope",
    "kv_cache_bytes",
    "kv_cache_table",
    "rope_frequencies",
    "rope_permutation",
]

# --- serving attention: paged KV cache, continuous batching (chapter 12)
from .paged_attention import paged_attention
from .paged_cache import PagedBatch, PagedKVCache, PagedLayer, PagedPack, PagedPackLayer
from .serving import Engine, Latency, Request

__all__ += [
    "Engine",
    "Latency",
    "PagedBatch",
    "PagedKVCache",
    "PagedLayer",
    "PagedPack",
    "PagedPackLayer",
    "Request",
    "paged_attention",
]

# --- decoding faster: speculative decoding, the acceptance rule, token trees (chapter 13)
from .kv_cache import Snapshots
from .speculative import (
    SpeculativeStats,
    acceptance_distribution,
    expected_tokens,
    prompt_lookup,
    speculative_decode,
    tree_mask,
    verify_guesses,
)

__all__ += [
    "Snapshots",
    "SpeculativeStats",
    "acceptance_distribution",
    "expected_tokens",
    "prompt_lookup",
    "speculative_decode",
    "tree_mask",
    "verify_guesses",
]

# --- attention across machines: ring attention and Ulysses (chapter 14)
from .distributed import (
    CommStats,
    allgather_attention,
    ring_attention,
    ring_blocks_per_rank,
    ulysses_attention,
    usp_attention,
    usp_groups,
    zigzag_merge,
    zigzag_split,
)

__all__ += [
    "CommStats",
    "allgather_attention",
    "ring_attention",
    "ring_blocks_per_rank",
    "ulysses_attention",
    "usp_attention",
    "usp_groups",
    "zigzag_merge",
    "zigzag_split",
]

# --- where attention goes: StreamingLLM's cache at cache positions (chapter 15)
from .streaming import StreamingKVCache

__all__ += ["StreamingKVCache"]

# --- long contexts: chunked layers, per-layer types, configs of 🤗 transformers (chapter 16)
from .convert import layer_options_from_hf
from .kv_cache import ChunkKVCache

__all__ += ["ChunkKVCache", "layer_options_from_hf"]

# --- latent and sparse attention: DeepSeek's MLA and DSA (chapter 17)
from .dsa import lightning_indexer, top_k_keys
from .mla import LatentKVCache, MultiHeadLatentAttention

__all__ += ["LatentKVCache", "MultiHeadLatentAttention", "lightning_indexer", "top_k_keys"]

# --- attention without softmax: linear attention, the delta rule, hybrids (chapter 18)
from .gated_deltanet import GatedDeltaNet, LayerStateCache
from .kda import KimiDeltaAttention, kimi_delta_attention
from .linear_attention import gated_delta_rule, linear_attention
from .mamba2 import Mamba2, mamba2_scan, ssd, ssd_mask

__all__ += ["GatedDeltaNet", "LayerStateCache", "gated_delta_rule", "linear_attention"]
__all__ += ["KimiDeltaAttention", "Mamba2", "kimi_delta_attention", "mamba2_scan"]
__all__ += ["ssd", "ssd_mask"]
from .compressed import CompressedIndexer, Compressor, compressed_attention, compressed_keep

__all__ += ["CompressedIndexer", "Compressor", "compressed_attention", "compressed_keep"]

# --- whole models: the blocks of today's decoders (CausalLM.from_hf, issue 35)
from .blocks import BlockSpec, GatedMLP, RMSNorm

__all__ += ["BlockSpec", "GatedMLP", "RMSNorm"]

# --- masks as programs: FlexAttention's mask_mod/score_mod for the book's masks (chapter 20);
# the builders (flex.causal, flex.document, flex.softcap, ...) are read from attention_lib.flex
from .flex import (
    alibi_slopes,
    dense_mask,
    document_ids,
    document_positions,
    tile_kinds,
    with_sink,
)

__all__ += [
    "alibi_slopes",
    "dense_mask",
    "document_ids",
    "document_positions",
    "tile_kinds",
    "with_sink",
]

# --- attention beyond text: images as tokens, 2-D RoPE, M-RoPE, the vision mask (chapter 19)
from .vision import (
    PatchEmbedding,
    VisionTransformer,
    mrope,
    mrope_positions,
    patch_positions,
    patchify,
    rope_2d,
    tokens_per_image,
    vision_mask,
)

__all__ += [
    "PatchEmbedding",
    "VisionTransformer",
    "mrope",
    "mrope_positions",
    "patch_positions",
    "patchify",
    "rope_2d",
    "tokens_per_image",
    "vision_mask",
]
