"""A small continuous-batching engine on a paged KV cache, with a scheduler.

A server receives requests at any time, with prompts and outputs of every
length. **Static batching** takes a batch of requests and runs it until the
*last* of them has finished: the slots of the requests that finished early
stay empty, and new requests wait for the whole batch. **Continuous
batching** (Orca, Yu et al. 2022; vLLM; nano-vllm) decides again at every
step: :meth:`Engine.step` retires the requests that have finished, admits
waiting ones while the cache has free blocks, and runs the batch. The
cache is a :class:`~attention_lib.serving_cache.ServingCache`: one group per
kind of layer (blocks of keys and values read **in place** by
:func:`~attention_lib.paged_attention`, a sliding group that frees the
blocks out of its window, blocks of MLA latents, state slots of linear
layers), so that every layer type is served. The sequences that add the
same number of tokens in a step run as one ``(S, L)`` batch.

Two schedules:

* ``max_num_batched_tokens=None`` (default, the teaching engine): each
  admitted prompt is **prefilled whole** when it is admitted (its own forward
  pass, which yields its first token), and the decode step batches one token
  of every running request;
* ``max_num_batched_tokens=N`` (vLLM v1's scheduler): **chunked prefill**.
  A step carries at most ``N`` tokens: first one decode token of every
  running request (or the next chunk of a prompt still being prefilled),
  then chunks of the prompts of newly admitted requests. A long prompt no
  longer stalls every other request's next token.

**Prefix caching** (``enable_prefix_caching=True``, vLLM and nano-vllm's
block manager): every full block of a sequence is published under a hash of
(its parent block's hash, its tokens); a new request whose prompt starts with
published blocks takes them (reference counts) and prefills only the rest.
An unheld published block stays findable until the pool reuses it, least
recently released first. **Admission** keeps a *watermark* of free blocks
(``watermark``, a fraction of the pool, 1% as in vLLM) for the running
requests to grow into, so that fewer of them are preempted.

The decisions are the :class:`~attention_lib.scheduler.Scheduler`'s. If
the pool runs out of blocks, the request admitted last is **preempted**: its
blocks are freed and it goes back to the front of the queue, to be
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

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .request import Latency, Request
from .scheduler import Scheduler
from .serving_cache import ServingCache
from .validation import (
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_prompt,
    check_real,
)


class Engine:
    """Serve :class:`Request` s with a :class:`~attention_lib.CausalLM` and a paged cache.

    Explained in chapter 12, *Serving attention*.

    Args:
        model: the model (run in ``eval()`` mode, without gradients); its
            layers softmax attention (full, sliding or chunked), latent
            attention (MLA, DSA) or Gated DeltaNet, alike or mixed.
        num_blocks: blocks of each block group of the cache.
        block_size: tokens per block.
        max_batch_size: the most requests running at once.
        policy: ``"continuous"`` (admit whenever there is room) or
            ``"static"`` (admit a new batch only when the whole running batch
            has finished).
        max_num_batched_tokens: ``None``: whole prefills at admission; an int
            ``N``: chunked prefill, at most ``N`` tokens per step (at most the
            model's ``max_len``).
        enable_prefix_caching: share full blocks of equal prefixes by hash
            (a model whose layers all keep every key in one group).
        watermark: the fraction of each group's blocks that admission leaves
            free while requests run (``int(watermark * num_blocks)``).

    Attributes:
        cache: the :class:`~attention_lib.serving_cache.ServingCache`.
        scheduler: the :class:`~attention_lib.scheduler.Scheduler`.
        trace: per step, ``(running requests, used blocks)`` after admission.
        batched: per step, the tokens run through the model.
        times: per step, its ``(start, end)`` ``perf_counter`` times.
        steps: the steps run so far.
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
        batch = check_int("max_batch_size", max_batch_size, minimum=1)
        budget = max_num_batched_tokens
        if budget is not None:  # one step's tokens: at most the model's max_len
            name, limit = "max_num_batched_tokens (<= the model's max_len)", model.max_len
            budget = check_int(name, budget, minimum=1, maximum=limit)
        caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        watermark = check_real("watermark", watermark, at_least=0, below=1)
        check_int("num_blocks", num_blocks, minimum=1)
        check_int("block_size", block_size, minimum=1)
        self.model, self.num_blocks, self.max_batch_size = model, num_blocks, batch
        self.cache = ServingCache(model, num_blocks, block_size, batch)
        if caching and not self.cache.prefix_caching:
            raise ValueError(f"prefix caching needs blocks in every group: {self.cache.names}")
        self.scheduler = Scheduler(self.cache, batch, policy, budget, caching, watermark)
        self.trace: list[tuple[int, int]] = []
        self.batched: list[int] = []
        self.times: list[tuple[float, float]] = []
        self.steps = self.computed_tokens = 0

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def preemptions(self) -> int:
        return self.scheduler.preemptions

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
        if total > self.model.max_len or -(-total // self.cache.block_size) > self.num_blocks:
            raise ValueError(f"a request of {total} tokens cannot fit the model or the pool")
        self.waiting.append(request)

    def _forward(self, work: list[tuple[Request, int]]) -> None:
        """Run ``count`` new tokens of each request, the requests with equal
        counts as one batch; a request whose tokens are then all computed
        gets its next (greedy) token."""
        keys = [self.cache.pass_key(r.seq, n) for r, n in work]
        for key in dict.fromkeys(keys):  # in order of first appearance
            requests = [r for (r, _), k in zip(work, keys) if k == key]
            requests.sort(key=lambda r: -r.computed)  # longest first: see paged_attention
            count = key[0]
            tokens = torch.tensor([r.pending(count) for r in requests])  # (S, count)
            step = self.cache.step([r.seq for r in requests], count)
            logits = self.model(tokens, cache=step, positions=step.positions, mask=step.mask)
            nexts = logits[:, -1].argmax(-1).tolist()  # (S,)
            for request, token in zip(requests, nexts):
                request.computed += count
                if request.computed == len(request.prompt) + len(request.output):
                    request.record(token, self.steps)
                if self.scheduler.prefix:
                    seen = request.tokens()[: request.computed].tolist()
                    self.cache.publish(request.seq, seen)
                self.cache.release(request.seq, request.computed)  # out of every window
            self.computed_tokens += tokens.numel()
            self.batched[-1] += tokens.numel()

    @torch.no_grad()
    def step(self) -> list[Request]:
        """One engine step: retire, admit, run the batch; returns the requests
        that finished in it."""
        self.times.append((time.perf_counter(), 0.0))
        self.batched.append(0)
        scheduler = self.scheduler
        done = scheduler.retire()
        if scheduler.budget is not None:
            work = scheduler.schedule_chunked(self.steps)
            self.trace.append((len(self.running), self.cache.num_used_blocks))
            if work:
                self._forward(work)
        else:
            for request, count in scheduler.admit_whole(self.steps, self.model.max_len):
                self._forward([(request, count)])
            done += scheduler.retire()  # a request may finish with its prefill's token
            self.trace.append((len(self.running), self.cache.num_used_blocks))
            scheduler.make_room_to_decode()
            if self.running:
                self._forward([(r, 1) for r in self.running])
        self.times[-1] = (self.times[-1][0], time.perf_counter())
        self.steps += 1
        return done + scheduler.retire()

    def latency(self, request: Request) -> Latency:
        """The TTFT and TPOT of a finished ``request`` served by this engine
        (see :class:`Latency`).

        Raises:
            ValueError: if ``request`` has no token yet.
        """
        return Latency.of(request, self.times)

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
