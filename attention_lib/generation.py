"""Autoregressive generation: greedy decoding and sampling, with or without a KV cache.

Each step turns the logits of the last position into one new token and feeds
it back. Greedy decoding takes the arg-max; sampling divides the logits by a
``temperature`` (below 1: sharper, above 1: flatter), optionally keeps only
the ``top_k`` largest, and draws from their softmax.

With ``use_cache=True`` the prompt runs through the model once and fills a
:class:`~attention_lib.KVCache`; every later step feeds only the newest token.
A model with a sliding window gets a rolling cache of ``window`` tokens
(chapter 9).
Without it, every step runs the whole sequence again. Both give the same
tokens; the cache makes a step cost ``O(T)`` instead of ``O(T^2)`` attention
work and ``O(1)`` instead of ``O(T)`` projections and feed-forward work.

Explained in chapter 8, *Attention that writes*.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .kv_cache import KVCache
from .validation import (
    check_bool,
    check_generator,
    check_instance,
    check_int,
    check_real,
    check_token_ids,
)


def _next_token(
    logits: Tensor,
    *,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
) -> Tensor:
    """``(B, V)`` logits -> ``(B, 1)`` token ids (greedy or sampled). No checks."""
    if not do_sample:
        return logits.argmax(-1, keepdim=True)  # (B, 1)
    logits = logits / temperature  # (B, V)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)


@torch.no_grad()
def generate(
    model: CausalLM,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``prompt`` by ``max_new_tokens`` tokens, one at a time.

    The model runs in ``eval()`` mode (its mode is restored afterwards) and
    without gradients. Greedy decoding (``do_sample=False``) gives the same
    tokens with and without the cache.

    Explained in chapter 8, *Attention that writes*.

    Args:
        model: a :class:`~attention_lib.CausalLM`.
        prompt: ``(B, T0)`` integer token ids, ``T0 >= 1``.
        max_new_tokens: how many tokens to add; ``T0 + max_new_tokens`` must not
            exceed ``model.max_len``.
        use_cache: keep the keys and values in a :class:`~attention_lib.KVCache`
            and feed one token per step (``False``: rerun the whole sequence).
        do_sample: sample from the softmax instead of taking the arg-max.
        temperature: divides the logits before sampling (must be ``> 0``).
        top_k: sample only among the ``top_k`` most likely tokens (``None``: all).
        generator: random source of the sampling (``torch.Generator``).

    Returns:
        ``(B, T0 + max_new_tokens)`` token ids, the prompt first.

    Raises:
        TypeError: if ``model`` is not a ``CausalLM``, ``prompt`` is not an
            integer tensor, or an option has the wrong type.
        ValueError: on an empty prompt, ids outside the vocabulary, generating
            past ``max_len``, ``temperature <= 0`` when sampling, or ``top_k < 1``.
    """
    check_instance("model", model, CausalLM, "a CausalLM")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    if check_token_ids(prompt, model.vocab_size, name="prompt").numel() == 0:
        raise ValueError(f"prompt must not be empty, got shape {tuple(prompt.shape)}")
    if prompt.shape[1] + max_new_tokens > model.max_len:
        total = f"{prompt.shape[1]} + max_new_tokens={max_new_tokens}"
        raise ValueError(f"cannot generate past max_len={model.max_len}: prompt {total}")
    check_bool("use_cache", use_cache)
    if check_bool("do_sample", do_sample):
        temperature = check_real("temperature", temperature, above=0)
    top_k = None if top_k is None else check_int("top_k", top_k, minimum=1)
    check_generator(generator, optional=True)

    was_training = model.training
    model.eval()
    try:
        tokens = prompt
        cache = KVCache(window=model.window) if use_cache else None  # rolling with a window
        new = prompt  # what the model has not seen yet
        for _ in range(max_new_tokens):
            logits = model(new if use_cache else tokens, cache=cache)  # (B, L, V)
            new = _next_token(
                logits[:, -1],
                do_sample=do_sample,
                temperature=temperature,
                top_k=top_k,
                generator=generator,
            )  # (B, 1)
            tokens = torch.cat([tokens, new], dim=1)  # (B, T + 1)
    finally:
        model.train(was_training)
    return tokens
