"""A small continuous-batching engine on a paged KV cache.

A server receives requests at any time, with prompts and outputs of every
length. **Static batching** takes a batch of requests and runs it until the
*last* of them has finished: the slots of the requests that finished early
stay empty, and new requests wait for the whole batch. **Continuous
batching** (Orca, Yu et al. 2022; vLLM; nano-vllm) decides again at every
step: :meth:`Engine.step` retires the requests that have finished, admits
waiting ones while the :class:`~attention_lib.PagedKVCache` has free blocks,
and runs one batched decode step for all running requests.

Design choices of this teaching engine: greedy decoding; each admitted prompt
is **prefilled separately** (one forward pass per new request, which also
yields its first token), and the decode step batches one token of every
running request; if the pool runs out of blocks during decoding, the request
admitted last is **preempted**: its blocks are freed and it goes back to the
front of the queue, to be prefilled again later with the tokens it has so far
(vLLM's "recompute"). Under greedy decoding, every request gets the tokens
that :func:`~attention_lib.generate` gives it alone.

Explained in chapter 11, *Serving attention*.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .paged_cache import PagedKVCache
from .validation import check_choice, check_instance, check_int, check_token_ids


@dataclass
class Request:
    """A generation request: greedy continuation of ``prompt``.

    Explained in chapter 11, *Serving attention*.

    Attributes:
        prompt: ``(T0,)`` token ids.
        max_new_tokens: the most tokens to generate.
        eos_token_id: stop after this token (``None``: only ``max_new_tokens``).
        arrival: the engine step at which the request arrives.
        output: the generated tokens so far.
        seq: its sequence id in the engine's paged cache while it runs
            (``None`` while it waits or after it finished).
    """

    prompt: Tensor
    max_new_tokens: int
    eos_token_id: int | None = None
    arrival: int = 0
    output: list[int] = field(default_factory=list)
    seq: int | None = None

    @property
    def finished(self) -> bool:
        ended = self.eos_token_id is not None and self.output[-1:] == [self.eos_token_id]
        return ended or len(self.output) >= self.max_new_tokens

    def tokens(self) -> Tensor:
        """The prompt followed by the output, ``(T0 + n,)``."""
        return torch.cat([self.prompt, self.prompt.new_tensor(self.output)])


class Engine:
    """Serve :class:`Request` s with a :class:`~attention_lib.CausalLM` and a paged cache.

    Explained in chapter 11, *Serving attention*.

    Args:
        model: the model (run in ``eval()`` mode, without gradients), with
            every layer alike: a model with ``layer_types`` is refused
            (``ValueError``), its layers keep caches of other kinds.
        num_blocks: blocks of the :class:`~attention_lib.PagedKVCache`.
        block_size: tokens per block.
        max_batch_size: the most requests running at once.
        policy: ``"continuous"`` (admit whenever there is room) or
            ``"static"`` (admit a new batch only when the whole running batch
            has finished).

    Attributes:
        cache: the :class:`~attention_lib.PagedKVCache`.
        waiting: the queue of requests not yet running.
        running: the requests in the batch.
        trace: per step, ``(running requests, used blocks)`` after admission.
        steps: the steps run so far.
        preemptions: how many times a request was preempted.
    """

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        max_batch_size: int = 8,
        *,
        policy: str = "continuous",
    ) -> None:
        check_instance("model", model, CausalLM, "a CausalLM")
        check_choice("policy", policy, ("continuous", "static"))
        self.model, self.policy = model, policy
        self.max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.trace: list[tuple[int, int]] = []
        self.steps = 0
        self.preemptions = 0

    def submit(self, request: Request) -> None:
        """Queue ``request`` (in arrival order).

        Raises:
            TypeError: if ``request`` is not a :class:`Request` or a field has the wrong type.
            ValueError: on an empty prompt or ids outside the vocabulary, ``max_new_tokens < 1``,
                a negative ``eos_token_id`` or ``arrival``, or a request too long for the
                model's ``max_len`` or the whole pool.
        """
        check_instance("request", request, Request, "a Request")
        prompt = request.prompt
        check_instance("request.prompt", prompt, Tensor, "a 1-D torch.Tensor of token ids")
        if prompt.dim() != 1 or not len(prompt):
            raise ValueError(f"request.prompt must be 1-D, not empty: {tuple(prompt.shape)}")
        check_token_ids(prompt[None], self.model.vocab_size, name="request.prompt[None]")
        if request.eos_token_id is not None:  # a float would never match: never stop
            check_int("eos_token_id", request.eos_token_id, minimum=0)
        check_int("arrival", request.arrival, minimum=0)
        total = len(request.prompt) + check_int("max_new_tokens", request.max_new_tokens, minimum=1)
        if total > self.model.max_len or -(-total // self.cache.block_size) > self.cache.num_blocks:
            raise ValueError(f"a request of {total} tokens cannot fit the model or the pool")
        self.waiting.append(request)

    def _forward(self, tokens: Tensor, seqs: list[int]) -> Tensor:
        """Run ``tokens (B, L)`` of ``seqs`` through the model on the paged cache;
        return the greedy next token of each, ``(B,)``."""
        batch = self.cache.extend(seqs, tokens.shape[1])
        logits = self.model(tokens, cache=batch, mask=batch.mask, positions=batch.positions)
        return logits[:, -1].argmax(-1)  # (B,)

    def _admit(self) -> None:
        """Prefill waiting requests, one at a time, while there is room."""
        if self.policy == "static" and self.running:
            return
        while self.waiting and len(self.running) < self.max_batch_size:
            request = self.waiting[0]
            if request.arrival > self.steps:
                break
            seen = request.tokens()  # after a preemption: the prompt and the output so far
            if self.cache.num_free_blocks * self.cache.block_size < len(seen) + 1:
                break  # no room for its prompt (and its next token): it waits
            self.waiting.popleft()
            request.seq = self.cache.new_sequence()
            request.output.append(int(self._forward(seen[None], [request.seq])[0]))
            self.running.append(request)

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
        request.seq = None
        self.waiting.appendleft(request)

    @torch.no_grad()
    def step(self) -> list[Request]:
        """One engine step: retire, admit, one batched decode step; returns the
        requests that finished in it."""
        done = self._retire()
        self._admit()
        done += self._retire()  # a request may finish with its prefill's token
        self.trace.append((len(self.running), self.cache.num_used_blocks))
        seqs = [r.seq for r in self.running]
        while seqs and not self.cache.can_extend(seqs, 1):
            self._preempt()
            seqs = [r.seq for r in self.running]
        if self.running:
            last = torch.tensor([[r.output[-1]] for r in self.running])  # (B, 1)
            for request, token in zip(self.running, self._forward(last, seqs).tolist()):
                request.output.append(token)
        self.steps += 1
        return done + self._retire()

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
