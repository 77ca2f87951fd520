"""Speculative decoding: guess several tokens cheaply, check them in one pass.

A decode step of a large model is memory-bound (chapter 12): it reads every
weight to produce one token, and checking ``k + 1`` tokens in one forward pass
costs about the same. So a cheap *draft* proposes ``k`` tokens (a small model,
:func:`prompt_lookup` copying from the prompt), the *target* runs once over
the last token and the ``k`` guesses, and keeps the longest prefix it agrees
with plus one token of its own. Then both caches roll back: every per-layer
cache of the package can ``crop`` its last tokens, and one that cannot simply
forget (a recurrent state, a rolling cache that has dropped tokens) comes back
to a ``snapshot`` taken before the guesses (:class:`~attention_lib.kv_cache.Snapshots`),
after which the accepted tokens are read again.

* Greedy: a guess is accepted when it is the target's arg-max, so the tokens
  equal greedy :func:`~attention_lib.generate`'s exactly.
* Sampling (Leviathan et al. 2023; Chen et al. 2023): guess ``x ~ q`` is
  accepted with probability ``min(1, p(x) / q(x))``; a rejected one is
  replaced by a draw from ``(p - q)+``, normalised. Every emitted token then
  follows the target's ``p`` exactly (:func:`acceptance_distribution`).
* A token tree (:func:`tree_mask`): several guesses verified in one pass, each
  node seeing the cache and its ancestors, at the position of its depth.

Batch size 1, as 🤗 transformers' assisted generation.

Explained in chapter 13, *Decoding faster*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .kv_cache import KVCache
from .validation import (
    check_bool,
    check_generator,
    check_instance,
    check_int,
    check_integer_tensor,
    check_real,
    check_tensor,
    check_token_ids,
)


@dataclass
class SpeculativeStats:
    """What one speculative decoding run counted.

    Explained in chapter 13, *Decoding faster*.

    Attributes:
        verifications: forward passes of the target after the prompt.
        drafted: guesses proposed.
        accepted: guesses accepted.
    """

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted guesses per guess, ``nan`` before any."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_verification(self) -> float:
        """The tokens emitted per pass of the target (accepted guesses, plus one a pass)."""
        return (self.accepted + self.verifications) / max(self.verifications, 1)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per verification, ``(1 - alpha^(k+1)) / (1 - alpha)``,
    when each of ``k`` guesses is accepted with probability ``alpha``
    independently (Leviathan et al. 2023); ``k + 1`` at ``alpha = 1``.

    Explained in chapter 13, *Decoding faster*.
    """
    alpha = check_real("alpha", alpha, at_least=0, at_most=1)
    k = check_int("k", k, minimum=0)
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def acceptance_distribution(p: Tensor, q: Tensor) -> Tensor:
    """The exact distribution of the token the sampling rule emits for one
    guess: ``x ~ q`` kept with probability ``min(1, p(x)/q(x))``, else a draw
    from ``(p - q)+`` normalised. It equals ``p`` (the rule is exact):
    ``min(p, q) + (1 - sum min(p, q)) (p - q)+ / sum (p - q)+``, and
    ``sum (p - q)+ = 1 - sum min(p, q)``.

    Explained in chapter 13, *Decoding faster*.

    Args:
        p: ``(..., V)`` the target's probabilities.
        q: ``(..., V)`` the draft's probabilities.

    Returns:
        ``(..., V)`` probabilities.
    """
    check_tensor("p", p, min_dim=1)
    check_tensor("q", q, min_dim=1)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have one shape, got {tuple(p.shape)}, {tuple(q.shape)}")
    kept = torch.minimum(p, q)  # (..., V): proposed and accepted
    residual = (p - q).clamp(min=0)  # (..., V)
    mass = residual.sum(-1, keepdim=True)  # (..., 1) = 1 - kept.sum()
    rejected = 1 - kept.sum(-1, keepdim=True)  # (..., 1): the chance of a rejection
    return kept + torch.where(mass > 0, rejected * residual / mass.clamp(min=1e-300), 0.0)


def verify_guesses(
    p: Tensor,
    drafts: Tensor,
    q: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Check ``k`` guesses against the target: how many are accepted, and the
    token that follows them. No checks (a building block of the loop).

    Explained in chapter 13, *Decoding faster*.

    Args:
        p: ``(k + 1, V)`` the target's probabilities after the last token and
            after each guess; with ``q=None`` and no ``generator``, anything
            whose arg-max is the target's choice (greedy: logits do).
        drafts: ``(k,)`` the guesses.
        q: ``(k, V)`` the draft's probabilities for sampling (``None``: a
            guess that is certain, as :func:`prompt_lookup`'s).
        generator: ``None`` for greedy verification; else the random source of
            the sampling rule.

    Returns:
        ``(a, token)``: ``0 <= a <= k`` accepted guesses and the next token
        (the target's own after them, or the resampled replacement).
    """
    k = len(drafts)
    if generator is None:  # greedy: the longest prefix equal to the arg-maxes
        best = p.argmax(-1)  # (k + 1,)
        a = int((best[:k] == drafts).long().cumprod(0).sum())
        return a, int(best[a])
    index = torch.arange(k)
    q_x = torch.ones(k, dtype=p.dtype) if q is None else q[index, drafts]  # (k,)
    p_x = p[index, drafts]  # (k,)
    for i in range(k):
        if float(torch.rand((), generator=generator, dtype=p.dtype)) * q_x[i] >= p_x[i]:
            proposal = torch.zeros_like(p[i]) if q is None else q[i]
            if q is None:
                proposal[drafts[i]] = 1
            residual = (p[i] - proposal).clamp(min=0)  # (V,): > 0 somewhere, as p(x) < q(x)
            return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def prompt_lookup(tokens: Tensor, num_tokens: int, max_ngram: int = 2) -> Tensor:
    """Guess the next tokens by copying: find the last ``n`` tokens earlier in
    ``tokens`` (``n = max_ngram`` first, then shorter) and return the (up to)
    ``num_tokens`` tokens that followed their first occurrence; empty if none
    (🤗 transformers' ``prompt_lookup_num_tokens``).

    Explained in chapter 13, *Decoding faster*.

    Args:
        tokens: ``(T,)`` the token ids so far.
        num_tokens: most tokens to return, ``>= 1``.
        max_ngram: longest n-gram to match, ``>= 1``.

    Returns:
        ``(m,)`` ids, ``0 <= m <= num_tokens``.
    """
    num_tokens = check_int("num_tokens", num_tokens, minimum=1)
    max_ngram = check_int("max_ngram", max_ngram, minimum=1)
    check_integer_tensor("tokens", tokens, what=" (T,)")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must have shape (T,), got {tuple(tokens.shape)}")
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        windows = tokens.unfold(0, n, 1)  # (T - n + 1, n)
        for start in (windows == tokens[-n:]).all(-1).nonzero()[:, 0].tolist():
            if start + n < len(tokens):  # not the last n-gram itself
                return tokens[start + n : start + n + num_tokens]
    return tokens[:0]


def tree_mask(parents: Sequence[int], past: int = 0) -> tuple[Tensor, Tensor]:
    """The keep-mask and positions of a token tree verified in one pass.

    Node ``i`` of the tree is a new token whose parent is node ``parents[i]``
    (an earlier node), or ``-1`` for a node that follows the ``past`` cached
    tokens directly. Each node sees every cached token, its ancestors and
    itself; its position is ``past`` plus its depth. Pass them to
    :class:`~attention_lib.CausalLM` as ``mask=keep[None]`` and
    ``positions=positions``: every node's logits are those of its branch
    run alone.

    Explained in chapter 13, *Decoding faster*.

    Args:
        parents: ``N`` parent indices, ``-1 <= parents[i] < i``.
        past: tokens the cache holds.

    Returns:
        ``(keep, positions)``: bool ``(N, past + N)`` (``True`` = may attend)
        and int64 ``(N,)``.

    Raises:
        ValueError: if a parent is not an earlier node (or ``-1``), or the
            tree is empty.
    """
    past = check_int("past", past, minimum=0)
    if isinstance(parents, Tensor):
        parents = parents.tolist()
    if not len(parents):
        raise ValueError("a tree needs at least one node, got parents=[]")
    keep = torch.zeros(len(parents), past + len(parents), dtype=torch.bool)
    keep[:, :past] = True
    depth = torch.zeros(len(parents), dtype=torch.long)
    for i, parent in enumerate(parents):
        parent = check_int(f"parents[{i}]", parent, minimum=-1)
        if parent >= i:
            raise ValueError(f"parents[{i}] = {parent}: a parent must be an earlier node or -1")
        if parent >= 0:
            keep[i] = keep[parent]  # its ancestors (and the cache)
            depth[i] = depth[parent] + 1
        keep[i, past + i] = True
    return keep, past + depth


def _probs(logits: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """``(..., V)`` logits -> the sampling distribution of :func:`~attention_lib.generate`."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


def _rollback(cache: KVCache, keep: int, saved: int) -> None:
    """Keep the first ``keep`` tokens seen; a cache that cannot forget (it
    holds a state or has dropped tokens) goes back to its snapshot at
    ``saved`` tokens instead, and reads the rest with its next call."""
    try:
        cache.crop(cache.position - keep)
    except ValueError:
        if saved:
            cache.crop(cache.position - saved)
        else:  # the snapshot of an empty cache: start again
            cache.layers.clear()


@torch.no_grad()
def speculative_decode(
    model: CausalLM,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    assistant_model: CausalLM | None = None,
    num_assistant_tokens: int = 5,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int = 2,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> tuple[Tensor, SpeculativeStats]:
    """Speculative decoding with a draft model or prompt lookup, and its counts.

    :func:`~attention_lib.generate` calls it when given ``assistant_model``
    or ``prompt_lookup_num_tokens`` (and returns only the tokens); both run
    in ``eval()`` mode, restored afterwards.

    Explained in chapter 13, *Decoding faster*.

    Args:
        model: the target :class:`~attention_lib.CausalLM`.
        prompt: ``(1, T0)`` token ids.
        max_new_tokens: tokens to add.
        assistant_model: the draft, a ``CausalLM`` with the same vocabulary.
        num_assistant_tokens: guesses ``k >= 1`` per verification (draft model).
        prompt_lookup_num_tokens: guesses per verification copied from the
            text so far (:func:`prompt_lookup`) instead of a draft model.
        max_matching_ngram_size: the longest n-gram prompt lookup matches.
        do_sample, temperature, top_k, generator: as :func:`~attention_lib.generate`; sampling
            uses the exact acceptance rule.
        eos_token_id: stop after this token.

    Returns:
        ``(tokens, stats)``: ``(1, T0 + n)`` ids and a :class:`SpeculativeStats`.

    Raises:
        TypeError: if a model is not a ``CausalLM``.
        ValueError: on a batch of more than one prompt, a draft with another
            vocabulary, ``k < 1``, both or neither of ``assistant_model`` and
            ``prompt_lookup_num_tokens``, or generating past ``max_len``.
    """
    check_instance("model", model, CausalLM, "a CausalLM")
    if (assistant_model is None) == (prompt_lookup_num_tokens is None):
        raise ValueError("give exactly one of assistant_model and prompt_lookup_num_tokens")
    if assistant_model is not None:
        check_instance("assistant_model", assistant_model, CausalLM, "a CausalLM (the draft)")
        if assistant_model.vocab_size != model.vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({assistant_model.vocab_size} tokens) must be the "
                f"target's ({model.vocab_size} tokens)"
            )
        k = check_int("num_assistant_tokens", num_assistant_tokens, minimum=1)
    else:
        k = check_int("prompt_lookup_num_tokens", prompt_lookup_num_tokens, minimum=1)
        check_int("max_matching_ngram_size", max_matching_ngram_size, minimum=1)
    check_token_ids(prompt, model.vocab_size, name="prompt")
    if prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise ValueError(
            f"speculative decoding takes one prompt (1, T0), got {tuple(prompt.shape)}"
        )
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    for name, m in (("model", model), ("assistant_model", assistant_model)):
        if m is not None and prompt.shape[1] + max_new_tokens > m.max_len:
            raise ValueError(f"cannot generate past {name}.max_len={m.max_len}")
    if check_bool("do_sample", do_sample):
        temperature = check_real("temperature", temperature, above=0)
    top_k = None if top_k is None else check_int("top_k", top_k, minimum=1)
    check_generator(generator, optional=True)
    eos_token_id = (
        None if eos_token_id is None else check_int("eos_token_id", eos_token_id, minimum=0)
    )
    models = [m for m in (model, assistant_model) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        return _loop(
            model,
            assistant_model,
            prompt,
            max_new_tokens,
            k,
            max_matching_ngram_size,
            (temperature, top_k) if do_sample else None,
            generator if do_sample else None,
            eos_token_id,
        )
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


def _loop(
    model: CausalLM,
    draft: CausalLM | None,
    tokens: Tensor,
    max_new: int,
    k: int,
    ngram: int,
    sample: tuple | None,
    generator: torch.Generator | None,
    eos: int | None,
) -> tuple[Tensor, SpeculativeStats]:
    """The loop of :func:`speculative_decode` on checked inputs."""
    if sample is not None and generator is None:
        generator = torch.Generator(tokens.device).manual_seed(int(torch.randint(2**62, ())))
    stats, end = SpeculativeStats(), tokens.shape[1] + max_new
    cache = KVCache(keep_last=model.window)  # it reads what it has not seen at each pass
    dcache = None if draft is None else KVCache(keep_last=draft.window)
    while tokens.shape[1] < end and not (eos is not None and int(tokens[0, -1]) == eos):
        k_now, start = min(k, end - tokens.shape[1] - 1), tokens.shape[1]
        q = None
        if draft is None:  # copy from the text so far
            guesses = prompt_lookup(tokens[0], k_now, ngram) if k_now else tokens[0, :0]
        else:
            guesses, q, dsaved = _draft(draft, dcache, tokens, k_now, sample, generator)
        saved = cache.position
        cache.snapshot()
        new = torch.cat([tokens[:, saved:], guesses[None]], dim=1)  # (1, unseen + k)
        logits = model(new, cache=cache)[0, -1 - len(guesses) :]  # (1 + k, V)
        p = logits if sample is None else _probs(logits, *sample)
        a, token = verify_guesses(p, guesses, q, generator=generator)
        stats.verifications, stats.drafted = stats.verifications + 1, stats.drafted + len(guesses)
        stats.accepted += a
        _rollback(cache, start + a, saved)  # every token before `token`
        if draft is not None:
            _rollback(dcache, min(dcache.position, start + a), dsaved)
        tokens = torch.cat([tokens, guesses[None, :a], tokens.new_tensor([[token]])], dim=1)
        if eos is not None and eos in tokens[0, start:].tolist():
            tokens = tokens[:, : start + tokens[0, start:].tolist().index(eos) + 1]
    return tokens, stats


def _draft(
    draft: CausalLM,
    cache: KVCache,
    tokens: Tensor,
    k: int,
    sample: tuple | None,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor | None, int]:
    """``k`` guesses of the draft, when sampling their ``(k, V)``
    probabilities, and the tokens its cache had seen at its snapshot; the
    draft reads what it has not seen, one token at a time after the first
    call."""
    saved = cache.position
    cache.snapshot()
    guesses, probs = [], []
    new = tokens[:, cache.position :]  # (1, >= 1): what the draft has not seen yet
    for _ in range(k):
        logits = draft(new, cache=cache)[0, -1]  # (V,)
        if sample is None:
            guess = logits.argmax(-1, keepdim=True)  # (1,)
        else:
            probs.append(_probs(logits, *sample))
            guess = torch.multinomial(probs[-1], 1, generator=generator)  # (1,)
        guesses.append(guess)
        new = guess[None]  # (1, 1)
    guesses = torch.cat(guesses) if guesses else tokens[0, :0]
    return guesses, torch.stack(probs) if probs else None, saved
