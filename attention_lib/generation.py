"""Autoregressive generation: greedy decoding and sampling, with or without a KV cache.

Each step turns the logits of the last position into one new token and feeds
it back. Greedy decoding takes the arg-max; sampling divides the logits by a
``temperature`` (below 1: sharper, above 1: flatter), optionally keeps only
the ``top_k`` largest, and draws from their softmax.

With ``use_cache=True`` the prompt runs through the model once and fills a
:class:`~attention_lib.KVCache`; every later step feeds only the newest token.
A model with a sliding window gets a rolling cache of ``window`` tokens
(chapter 10).
Without it, every step runs the whole sequence again. Both give the same
tokens; the cache makes a step cost ``O(T)`` instead of ``O(T^2)`` attention
work and ``O(1)`` instead of ``O(T)`` projections and feed-forward work.

**Ragged batches** (chapter 12): prompts of different lengths, given as a
list of 1-D tensors (or as a left-padded ``(B, T0)`` tensor with an
``attention_mask``), are *left*-padded into one batch, so that every
sequence's newest token is in the last column. A padding keep-mask hides the
padding from every query, and each sequence's positions count from its own
first real token, so under greedy decoding each sequence gets the tokens it
would get alone. With ``eos_token_id`` a sequence stops at its end-of-sequence
token, and generation stops when all have.

Explained in chapter 9, *Attention that writes*; ragged batches and
``eos_token_id`` in chapter 12, *Serving attention*.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .kv_cache import KVCache
from .speculative import speculative_decode
from .validation import (
    check_bool,
    check_generator,
    check_instance,
    check_int,
    check_mask,
    check_prompt,
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


def _left_pad(prompts: list[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    """1-D prompts -> left-padded ``(B, T0)`` ids and their ``(B, T0)`` bool mask."""
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), pad, dtype=prompts[0].dtype)
    mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for row, p in enumerate(prompts):
        tokens[row, longest - len(p) :], mask[row, longest - len(p) :] = p, True
    return tokens.to(prompts[0].device), mask.to(prompts[0].device)


def _check_prompts(prompts: list | tuple, vocab_size: int) -> None:
    """Every prompt of a ragged batch is a non-empty 1-D tensor of ids."""
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got an empty list")
    for i, p in enumerate(prompts):
        check_prompt(f"prompt[{i}]", p, vocab_size)


@torch.no_grad()
def generate(
    model: CausalLM,
    prompt: Tensor | list[Tensor],
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    eos_token_id: int | None = None,
    assistant_model: CausalLM | None = None,
    num_assistant_tokens: int = 5,
    prompt_lookup_num_tokens: int | None = None,
) -> Tensor | list[Tensor]:
    """Continue ``prompt`` by ``max_new_tokens`` tokens, one at a time (or
    several per pass of ``model``, with speculative decoding).

    The model runs in ``eval()`` mode (its mode is restored afterwards) and
    without gradients. Greedy decoding (``do_sample=False``) gives the same
    tokens with and without the cache, and, in a ragged batch, the same tokens
    as generating each prompt alone.

    Explained in chapter 9, *Attention that writes*; ragged batches
    (``prompt`` as a list, ``attention_mask``) and ``eos_token_id`` in
    chapter 12, *Serving attention*; ``assistant_model`` and
    ``prompt_lookup_num_tokens`` in chapter 13, *Decoding faster*.

    Args:
        model: a :class:`~attention_lib.CausalLM`.
        prompt: ``(B, T0)`` integer token ids, ``T0 >= 1``; or a list of
            ``B`` 1-D id tensors of different lengths (a ragged batch, left-padded
            internally).
        max_new_tokens: how many tokens to add; no sequence may run past
            ``model.max_len``.
        use_cache: keep the keys and values in a :class:`~attention_lib.KVCache`
            and feed one token per step (``False``: rerun the whole sequence).
        do_sample: sample from the softmax instead of taking the arg-max.
        temperature: divides the logits before sampling (must be ``> 0``).
        top_k: sample only among the ``top_k`` most likely tokens (``None``: all).
        generator: random source of the sampling (``torch.Generator``).
        attention_mask: with a ``(B, T0)`` tensor ``prompt``: its ``(B, T0)``
            keep-mask, ``1`` for a real token, ``0`` for padding, which must be
            *left* padding (🤗 transformers' convention); ``None``: no padding.
        eos_token_id: the end-of-sequence token: a sequence that emits it
            stops (later columns of a tensor result repeat it), and
            generation ends when every sequence has; ``None``: never stop early.
        assistant_model: a draft ``CausalLM`` with the same vocabulary:
            speculative decoding (``attention_lib.speculative``) of one
            ``(1, T0)`` prompt, with the cache; greedy gives the tokens of
            greedy decoding, sampling follows ``model``'s distribution exactly.
        num_assistant_tokens: the draft's guesses per pass of ``model``, ``>= 1``.
        prompt_lookup_num_tokens: instead of a draft, guess this many tokens
            by copying what followed the last two tokens earlier in the text
            (:func:`~attention_lib.speculative.prompt_lookup`).

    Returns:
        For a tensor ``prompt``: ``(B, T0 + n)`` token ids, the prompt first,
        with ``n = max_new_tokens`` (fewer if every sequence stopped at
        ``eos_token_id``). For a list: a list of 1-D tensors, each prompt
        followed by its own new tokens (up to its ``eos_token_id``).

    Raises:
        TypeError: if ``model`` is not a ``CausalLM``, a prompt is not an
            integer tensor, or an option has the wrong type.
        ValueError: on an empty prompt, ids outside the vocabulary, generating
            past ``max_len``, ``temperature <= 0`` when sampling, ``top_k < 1``,
            or an ``attention_mask`` that does not fit or pads on the right.
    """
    check_instance("model", model, CausalLM, "a CausalLM")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    if assistant_model is not None or prompt_lookup_num_tokens is not None:  # chapter 13
        if attention_mask is not None or isinstance(prompt, (list, tuple)) or not use_cache:
            raise ValueError("speculative decoding takes one (1, T0) prompt, with the cache")
        return speculative_decode(
            model,
            prompt,
            max_new_tokens,
            assistant_model=assistant_model,
            num_assistant_tokens=num_assistant_tokens,
            prompt_lookup_num_tokens=prompt_lookup_num_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
            eos_token_id=eos_token_id,
        )[0]
    ragged = isinstance(prompt, (list, tuple))
    if ragged:
        if attention_mask is not None:
            raise ValueError("attention_mask goes with a (B, T0) tensor prompt, not a list")
        _check_prompts(prompt, model.vocab_size)
        prompt, attention_mask = _left_pad(list(prompt), 0)  # (B, T0) each
    elif check_token_ids(prompt, model.vocab_size, name="prompt").numel() == 0:
        raise ValueError(f"prompt must not be empty, got shape {tuple(prompt.shape)}")
    if prompt.shape[1] + max_new_tokens > model.max_len:
        total = f"{prompt.shape[1]} + max_new_tokens={max_new_tokens}"
        raise ValueError(f"cannot generate past max_len={model.max_len}: prompt {total}")
    if attention_mask is not None and not ragged:
        attention_mask = check_mask(attention_mask, prompt.shape, device=prompt.device)
        if attention_mask.shape != prompt.shape or not bool(
            (attention_mask[:, 1:] >= attention_mask[:, :-1]).all() & attention_mask[:, -1].all()
        ):
            raise ValueError("attention_mask must be (B, T0) with left padding: 0...0 1...1")
    check_bool("use_cache", use_cache)
    if check_bool("do_sample", do_sample):
        temperature = check_real("temperature", temperature, above=0)
    top_k = None if top_k is None else check_int("top_k", top_k, minimum=1)
    check_generator(generator, optional=True)
    eos_token_id = (
        None if eos_token_id is None else check_int("eos_token_id", eos_token_id, minimum=0)
    )

    was_training = model.training
    model.eval()
    try:
        tokens = _decode(
            model,
            prompt,
            max_new_tokens,
            attention_mask,
            use_cache=use_cache,
            eos_token_id=eos_token_id,
            sample={"do_sample": do_sample, "temperature": temperature, "top_k": top_k},
            generator=generator,
        )
    finally:
        model.train(was_training)
    if not ragged:
        return tokens
    added = tokens.shape[1] - prompt.shape[1]
    out = []
    for row, pad in zip(tokens, (~attention_mask).sum(1).tolist()):  # its left padding
        row = row[pad:]  # (T0_b + added,)
        ends = [] if eos_token_id is None else (row[len(row) - added :] == eos_token_id).nonzero()
        if len(ends):  # cut after its first eos
            row = row[: len(row) - added + int(ends[0]) + 1]
        out.append(row)
    return out


def _decode(
    model: CausalLM,
    prompt: Tensor,
    max_new_tokens: int,
    mask: Tensor | None,
    *,
    use_cache: bool,
    eos_token_id: int | None,
    sample: dict,
    generator: torch.Generator | None,
) -> Tensor:
    """The loop of :func:`generate` on checked inputs: ``(B, T0 + n)`` ids."""
    tokens = prompt
    positions = None  # 0, 1, ... after the cache: every row starts at column 0
    if mask is not None:  # left padding: each row counts from its first real token
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T0)
    cache = KVCache(keep_last=model.window) if use_cache else None  # rolling with a window
    done = torch.zeros(prompt.shape[0], 1, dtype=torch.bool, device=prompt.device)
    new = prompt  # what the model has not seen yet
    for _ in range(max_new_tokens):
        if use_cache:
            logits = model(new, cache=cache, mask=mask, positions=positions)  # (B, L, V)
        else:
            logits = model(tokens, mask=mask, positions=positions)
        new = _next_token(logits[:, -1], **sample, generator=generator)  # (B, 1)
        if eos_token_id is not None:  # a finished row repeats its eos
            new = new.masked_fill(done, eos_token_id)
            done = done | (new == eos_token_id)
        tokens = torch.cat([tokens, new], dim=1)  # (B, T + 1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (B, T + 1)
            last = positions[:, -1:] + 1  # (B, 1)
            positions = last if use_cache else torch.cat([positions, last], dim=1)
        if bool(done.all()):
            break
    return tokens
