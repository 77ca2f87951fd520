"""A small continuous-batching engine on a paged KV cache, with a scheduler.

A server receives requests at any time, with prompts and outputs of every
length. **Static batching** takes a batch of requests and runs it until the
*last* of them has finished: the slots of the requests that finished early
stay empty, and new requests wait for the whole batch. **Continuous
batching** (Orca, Yu et al. 2022; vLLM; nano-vllm) decides again at every
step: :meth:`Engine.step` retires the requests that have finished, admits
waiting ones while the :class:`~attention_lib.PagedKVCache` has free blocks,
and runs the batch. Attention reads the blocks **in place**
(:func:`~attention_lib.paged_attention`): every step's tokens
are packed in one row, and each sequence's queries walk its own block table.

Two schedules:

* ``max_num_batched_tokens=None`` (default, the teaching engine): each
  admitted prompt is **prefilled whole** when it is admitted (its own forward
  pass, which yields its first token), and the decode step batches one token
  of every running request;
* ``max_num_batched_tokens=N`` (vLLM v1's scheduler): **chunked prefill**.
  One forward pass per step carries at most ``N`` tokens: first one decode
  token of every running request (or the next chunk of a prompt still being
  prefilled), then chunks of the prompts of newly admitted requests. A long
  prompt no longer stalls every other request's next token.

**Prefix caching** (``enable_prefix_caching=True``, vLLM and nano-vllm's
block manager): every full block of a sequence is published under a hash of
(its parent block's hash, its tokens); a new request whose prompt starts with
published blocks takes them (reference counts) and prefills only the rest.
An unheld published block stays findable until the pool reuses it, least
recently released first. **Admission** keeps a *watermark* of free blocks
(``watermark``, a fraction of the pool, 1% as in vLLM) for the running
requests to grow into, so that fewer of them are preempted.

If the pool runs out of blocks, the request admitted last is **preempted**:
its blocks are freed and it goes back to the front of the queue, to be
prefilled again later with the tokens it has so far (vLLM's "recompute").
Under greedy decoding, every request gets the tokens that
:func:`~attention_lib.generate` gives it alone, whatever the schedule.

Each request records the step and the time of its first token and of its
end: :meth:`Engine.latency` gives its time to first token (TTFT) and time
per output token (TPOT), in steps and seconds.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .paged_cache import PagedKVCache
from .validation import (
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_prompt,
    check_real,
)


@dataclass
class Request:
    """A generation request: greedy continuation of ``prompt``.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        prompt: ``(T0,)`` token ids.
        max_new_tokens: the most tokens to generate.
        eos_token_id: stop after this token (``None``: only ``max_new_tokens``).
        arrival: the engine step at which the request arrives.
        output: the generated tokens so far.
        seq: its sequence id in the engine's paged cache while it runs
            (``None`` while it waits or after it finished).
        computed: tokens whose keys and values the cache holds (a prompt
            being prefilled in chunks has ``computed < len(prompt)``).
        cached: prompt tokens found in the prefix cache at its last admission.
        first_step: the step that produced its first token (``None`` before).
        last_step: the step that produced its last token.
    """

    prompt: Tensor
    max_new_tokens: int
    eos_token_id: int | None = None
    arrival: int = 0
    output: list[int] = field(default_factory=list)
    seq: int | None = None
    computed: int = 0
    cached: int = 0
    first_step: int | None = None
    last_step: int | None = None

    @property
    def finished(self) -> bool:
        ended = self.eos_token_id is not None and self.output[-1:] == [self.eos_token_id]
        return ended or len(self.output) >= self.max_new_tokens

    def tokens(self) -> Tensor:
        """The prompt followed by the output, ``(T0 + n,)``."""
        return torch.cat([self.prompt, self.prompt.new_tensor(self.output)])


class Latency(NamedTuple):
    """What a request's user sees (chapter 12): time to first token (TTFT),
    from its arrival to the end of the step that produced its first token,
    and time per output token (TPOT), the mean gap between its later tokens
    (``nan`` with one token); in engine steps and in seconds."""

    ttft_steps: int
    tpot_steps: float
    ttft_seconds: float
    tpot_seconds: float


class Engine:
    """Serve :class:`Request` s with a :class:`~attention_lib.CausalLM` and a paged cache.

    Explained in chapter 12, *Serving attention*.

    Args:
        model: the model (run in ``eval()`` mode, without gradients); every
            layer softmax attention, full, sliding or chunked, alike or mixed
            (a ``"linear"`` or ``"mla"`` layer is refused, ``ValueError``
            naming it).
        num_blocks: blocks of the :class:`~attention_lib.PagedKVCache`.
        block_size: tokens per block.
        max_batch_size: the most requests running at once.
        policy: ``"continuous"`` (admit whenever there is room) or
            ``"static"`` (admit a new batch only when the whole running batch
            has finished).
        max_num_batched_tokens: ``None``: whole prefills at admission; an int
            ``N``: chunked prefill, at most ``N`` tokens per step (at most the
            model's ``max_len``: a step runs as one packed row).
        enable_prefix_caching: share full blocks of equal prefixes by hash.
        watermark: the fraction of the pool that admission leaves free while
            requests run (``int(watermark * num_blocks)`` blocks).

    Attributes:
        cache: the :class:`~attention_lib.PagedKVCache`.
        waiting: the queue of requests not yet running.
        running: the requests in the batch, in admission order.
        trace: per step, ``(running requests, used blocks)`` after admission.
        batched: per step, the tokens run through the model.
        steps: the steps run so far.
        preemptions: how many times a request was preempted.
        computed_tokens: prompt and output tokens run through the model.
    """

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        max_batch_size: int = 8,
        *,
        policy: str = "continuous",
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = False,
        watermark: float = 0.01,
    ) -> None:
        check_instance("model", model, CausalLM, "a CausalLM")
        check_choice("policy", policy, ("continuous", "static"))
        self.model, self.policy = model, policy
        self.max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        self.chunked = max_num_batched_tokens is not None
        self.budget = model.max_len
        if self.chunked:  # a step's tokens run as one packed row: at most the model's max_len
            name, limit = "max_num_batched_tokens (<= the model's max_len)", model.max_len
            self.budget = check_int(name, max_num_batched_tokens, minimum=1, maximum=limit)
        self.prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        watermark = check_real("watermark", watermark, at_least=0, below=1)
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.watermark_blocks = int(watermark * num_blocks)
        self._first_key = [_first_key(layer.self_attn) for layer in model.blocks.layers]
        self._windowed = all(
            layer.self_attn.window or layer.self_attn.chunk_size for layer in model.blocks.layers
        )  # every layer forgets old keys: blocks can be released
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.trace: list[tuple[int, int]] = []
        self.batched: list[int] = []
        self.times: list[tuple[float, float]] = []  # (start, end) of every step
        self.steps = 0
        self.preemptions = 0
        self.computed_tokens = 0

    def submit(self, request: Request) -> None:
        """Queue ``request`` (in arrival order).

        Raises:
            TypeError: if ``request`` is not a :class:`Request` or a field has the wrong type.
            ValueError: on an empty prompt or ids outside the vocabulary, ``max_new_tokens < 1``,
                a negative ``eos_token_id`` or ``arrival``, or a request too long for the
                model's ``max_len`` or the whole pool.
        """
        check_instance("request", request, Request, "a Request")
        check_prompt("request.prompt", request.prompt, self.model.vocab_size)
        if request.eos_token_id is not None:  # a float would never match: never stop
            check_int("eos_token_id", request.eos_token_id, minimum=0)
        check_int("arrival", request.arrival, minimum=0)
        total = len(request.prompt) + check_int("max_new_tokens", request.max_new_tokens, minimum=1)
        if total > self.model.max_len or -(-total // self.cache.block_size) > self.cache.num_blocks:
            raise ValueError(f"a request of {total} tokens cannot fit the model or the pool")
        self.waiting.append(request)

    def _forward(self, work: list[tuple[Request, int]]) -> None:
        """One forward pass: ``count`` new tokens of each request, packed in one
        row, read in place; a request whose tokens are then all computed gets
        its next (greedy) token."""
        seqs, counts = [r.seq for r, _ in work], [n for _, n in work]
        tokens = torch.cat([_pending(r, n) for r, n in work])
        pack = self.cache.pack(seqs, counts)
        logits = self.model(tokens[None], cache=pack, positions=pack.positions)  # (1, N, V)
        nexts = logits[0, pack.last].argmax(-1).tolist()  # (S,)
        self.computed_tokens += len(tokens)
        for (request, n), token in zip(work, nexts):
            request.computed += n
            if request.computed == len(request.prompt) + len(request.output):
                request.output.append(token)
                if request.first_step is None:
                    request.first_step = self.steps
                request.last_step = self.steps
            if self.prefix_caching:
                self.cache.publish(request.seq, request.tokens()[: request.computed].tolist())
            if self._windowed:  # blocks no later query of any layer reads
                first = min(f(request.computed) for f in self._first_key)
                self.cache.release_before(request.seq, first)
        self.batched[-1] += len(tokens)

    def _blocks_for(self, request: Request, count: int) -> int:
        return self.cache.blocks_needed(request.seq, count)

    def _start(self, request: Request) -> int:
        """Give ``request`` a sequence (with its cached prefix) and return the
        tokens it still has to compute."""
        request.seq = self.cache.new_sequence()
        seen = request.tokens()
        request.computed = request.cached = 0
        if self.prefix_caching:  # at least its last token is computed (its logits)
            blocks = self.cache.match_prefix(seen[:-1].tolist())
            self.cache.share_prefix(request.seq, blocks)
            request.computed = request.cached = len(blocks) * self.cache.block_size
        return len(seen) - request.computed

    def _fits(self, request: Request, budget: int, taken: int) -> bool:
        """Whether ``request`` (not started) can be admitted now, computing at
        most ``budget`` tokens, ``taken`` blocks being promised already: its
        blocks (cached ones that are unheld leave the free list too) and,
        while others run, the watermark."""
        seen = request.tokens()
        size, hit = self.cache.block_size, []
        if self.prefix_caching:
            hit = self.cache.match_prefix(seen[:-1].tolist())
        count = min(len(seen) - len(hit) * size, budget)
        unheld = sum(1 for b in hit if self.cache.ref_count[b] == 0)
        extra = 0 if self.chunked else 1  # a whole prefill: room for its next token too
        need = -(-(len(hit) * size + count + extra) // size) - len(hit) + unheld
        reserve = self.watermark_blocks if self.running else 0
        return need + taken + reserve <= self.cache.num_free_blocks

    def _admit(self) -> None:
        """Whole prefills: admit and prefill waiting requests, one at a time."""
        if self.policy == "static" and self.running:
            return
        while self.waiting and len(self.running) < self.max_batch_size:
            request = self.waiting[0]
            if request.arrival > self.steps:
                break
            if not self._fits(request, self.model.max_len, 0):
                break  # no room for its prompt (and its next token): it waits
            self.waiting.popleft()
            self._forward([(request, self._start(request))])
            self.running.append(request)

    def _schedule(self) -> list[tuple[Request, int]]:
        """Chunked prefill: the work of one step under the token budget, the
        running requests first (preempting the last admitted if blocks run
        out), then new requests' prompts."""
        work, budget, taken = [], self.budget, 0
        i = 0
        while i < len(self.running) and budget:
            request = self.running[i]
            count = min(len(request.tokens()) - request.computed, budget)
            need = self._blocks_for(request, count)
            while need + taken > self.cache.num_free_blocks and self.running[-1] is not request:
                self._preempt()
            if need + taken > self.cache.num_free_blocks:
                self._preempt()  # itself: the last one left to preempt
                break
            work.append((request, count))
            budget, taken, i = budget - count, taken + need, i + 1
        if self.policy == "static" and self.running:
            return work
        while self.waiting and budget and len(self.running) < self.max_batch_size:
            request = self.waiting[0]
            if request.arrival > self.steps:
                break
            if not self._fits(request, budget, taken):
                break
            self.waiting.popleft()
            count = min(self._start(request), budget)
            work.append((request, count))
            budget, taken = budget - count, taken + self._blocks_for(request, count)
            self.running.append(request)
        return work

    def _retire(self) -> list[Request]:
        done = [r for r in self.running if r.finished]
        for request in done:
            self.cache.free_sequence(request.seq)
            request.seq = None
        self.running = [r for r in self.running if not r.finished]
        return done

    def _preempt(self) -> None:
        """Free the last admitted request's blocks and queue it again, first."""
        request = self.running.pop()
        self.preemptions += 1
        self.cache.free_sequence(request.seq)
        request.seq, request.computed = None, 0
        self.waiting.appendleft(request)

    @torch.no_grad()
    def step(self) -> list[Request]:
        """One engine step: retire, admit, run the batch; returns the requests
        that finished in it."""
        self.times.append((time.perf_counter(), 0.0))
        self.batched.append(0)
        done = self._retire()
        if self.chunked:
            work = self._schedule()
            self.trace.append((len(self.running), self.cache.num_used_blocks))
            if work:
                self._forward(work)
        else:
            self._admit()
            done += self._retire()  # a request may finish with its prefill's token
            self.trace.append((len(self.running), self.cache.num_used_blocks))
            seqs = [r.seq for r in self.running]
            while seqs and not self.cache.can_extend(seqs, 1):
                self._preempt()
                seqs = [r.seq for r in self.running]
            if self.running:
                self._forward([(r, 1) for r in self.running])
        self.times[-1] = (self.times[-1][0], time.perf_counter())
        self.steps += 1
        return done + self._retire()

    def latency(self, request: Request) -> Latency:
        """The TTFT and TPOT of a finished ``request`` served by this engine
        (see :class:`Latency`).

        Raises:
            ValueError: if ``request`` has no token yet.
        """
        if request.first_step is None or request.last_step is None:
            raise ValueError("the request has produced no token yet")
        arrival = self.times[request.arrival][0]
        first, last = self.times[request.first_step][1], self.times[request.last_step][1]
        gaps = len(request.output) - 1
        return Latency(
            request.first_step - request.arrival + 1,
            (request.last_step - request.first_step) / gaps if gaps else float("nan"),
            first - arrival,
            (last - first) / gaps if gaps else float("nan"),
        )

    def run(self, requests: list[Request]) -> list[Tensor]:
        """Serve ``requests`` to the end; return each one's prompt and output,
        in the order given."""
        was_training = self.model.training
        self.model.eval()
        try:
            for request in sorted(requests, key=lambda r: r.arrival):
                self.submit(request)
            while self.waiting or self.running:
                self.step()
        finally:
            self.model.train(was_training)
        return [r.tokens() for r in requests]


def _pending(request: Request, count: int) -> Tensor:
    """The ``count`` tokens of ``request`` after the ``computed`` ones, ``(count,)``."""
    start = request.computed - len(request.prompt)
    if start >= 0:  # decoding: from the output list, without building tokens()
        return request.prompt.new_tensor(request.output[start : start + count])
    return request.tokens()[request.computed : request.computed + count]


def _first_key(mixer: torch.nn.Module):
    """The first key position a query at position ``p`` of this layer reads:
    ``0`` (full), its window's start (sliding) or its chunk's start (chunked)."""
    window, chunk = getattr(mixer, "window", None), getattr(mixer, "chunk_size", None)
    if window is not None:
        return lambda p: max(0, p - window + 1)
    if chunk is not None:
        return lambda p: p // chunk * chunk
    return lambda p: 0
