"""How much memory a KV cache takes at real model sizes.

During generation every layer keeps the keys and values of every past token:
``2 (K and V) x layers x KV heads x d_head`` numbers per token. Grouped-query
attention shrinks the cache by ``num_heads / num_kv_heads`` (multi-query
attention, one KV head, by ``num_heads``); a sliding window caps the number of
tokens kept.

The shapes below are copied from the models' published ``config.json`` files
(``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``hidden_size / num_attention_heads``, ``sliding_window``).

Explained in chapter 10, *Attention in today's LLMs*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .validation import check_instance, check_int


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a decoder, as far as its KV cache is concerned.

    Explained in chapter 10, *Attention in today's LLMs*.

    Attributes:
        name: the model's name.
        num_layers: decoder layers (each keeps its own cache).
        num_heads: query heads per layer.
        num_kv_heads: key/value heads per layer (``num_heads``: MHA; 1: MQA).
        d_head: width of one head.
        window: sliding-window length (tokens kept per layer), or ``None``.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_head: int
    window: int | None = None

    def kv_cache_bytes(self, seq_len: int, *, batch_size: int = 1, bytes_per_value: int = 2) -> int:
        """The cache of ``batch_size`` sequences of ``seq_len`` tokens (see :func:`kv_cache_bytes`)."""
        return kv_cache_bytes(
            self.num_layers,
            self.num_kv_heads,
            self.d_head,
            seq_len,
            batch_size=batch_size,
            bytes_per_value=bytes_per_value,
            window=self.window,
        )


#: Published shapes (``config.json`` of each model on the Hugging Face Hub).
PUBLISHED_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        # meta-llama/Llama-2-7b-hf: 32 layers, 32 heads, 32 KV heads, hidden 4096 (MHA)
        ModelShape("Llama-2-7B", num_layers=32, num_heads=32, num_kv_heads=32, d_head=128),
        # meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 (GQA)
        ModelShape("Llama-3-8B", num_layers=32, num_heads=32, num_kv_heads=8, d_head=128),
        # mistralai/Mistral-7B-v0.1: like Llama-3-8B's attention, plus a 4096-token window
        ModelShape(
            "Mistral-7B-v0.1",
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            d_head=128,
            window=4096,
        ),
        # tiiuae/falcon-7b: 32 layers, 71 heads, hidden 4544, multi_query (MQA)
        ModelShape("Falcon-7B", num_layers=32, num_heads=71, num_kv_heads=1, d_head=64),
    )
}


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    d_head: int,
    seq_len: int,
    *,
    batch_size: int = 1,
    bytes_per_value: int = 2,
    window: int | None = None,
) -> int:
    """Bytes of the keys and values a decoder keeps for ``batch_size`` sequences.

    ``2 * num_layers * num_kv_heads * d_head * tokens * batch_size *
    bytes_per_value``, where ``tokens = min(seq_len, window)`` (a rolling cache
    keeps only the last ``window`` tokens). The number of *query* heads does not
    appear: only K and V are cached.

    Explained in chapter 10, *Attention in today's LLMs*.

    Args:
        num_layers: decoder layers.
        num_kv_heads: key/value heads per layer.
        d_head: width of one head.
        seq_len: tokens in each sequence.
        batch_size: sequences decoded together.
        bytes_per_value: 2 for float16/bfloat16, 4 for float32, 1 for an 8-bit cache.
        window: sliding-window length, or ``None`` to keep every token.

    Returns:
        The size in bytes (an int).

    Raises:
        TypeError: if an argument is not an int.
        ValueError: if an argument is below its minimum (``seq_len >= 0``, the
            rest ``>= 1``).

    Example:
        >>> kv_cache_bytes(32, 8, 128, 4096) / 1e9  # Llama-3-8B, 4k tokens, bf16
        0.536870912
    """
    check_int("num_layers", num_layers, minimum=1)
    check_int("num_kv_heads", num_kv_heads, minimum=1)
    check_int("d_head", d_head, minimum=1)
    check_int("seq_len", seq_len, minimum=0)
    check_int("batch_size", batch_size, minimum=1)
    check_int("bytes_per_value", bytes_per_value, minimum=1)
    tokens = seq_len if window is None else min(seq_len, check_int("window", window, minimum=1))
    return 2 * num_layers * num_kv_heads * d_head * tokens * batch_size * bytes_per_value


def kv_cache_table(
    seq_lens: Sequence[int] = (4096, 32768, 131072),
    shapes: Iterable[ModelShape] | None = None,
    *,
    bytes_per_value: int = 2,
) -> dict[str, list[float]]:
    """The KV-cache size of one sequence, in GB (10^9 bytes), per model and length.

    Explained in chapter 10, *Attention in today's LLMs*.

    Args:
        seq_lens: sequence lengths (tokens), one column each.
        shapes: the models, one row each; defaults to :data:`PUBLISHED_SHAPES`.
        bytes_per_value: 2 for float16/bfloat16.

    Returns:
        ``{model name: [GB at each of seq_lens]}``, in the order of ``shapes``.

    Raises:
        TypeError: if ``shapes`` holds something other than :class:`ModelShape`.
        ValueError: as :func:`kv_cache_bytes`.
    """
    shapes = list(PUBLISHED_SHAPES.values() if shapes is None else shapes)
    for shape in shapes:
        check_instance("shapes[i]", shape, ModelShape, "a ModelShape")
    return {
        shape.name: [
            shape.kv_cache_bytes(n, bytes_per_value=bytes_per_value) / 1e9 for n in seq_lens
        ]
        for shape in shapes
    }
