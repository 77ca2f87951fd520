"""The serving engine's scheduler: who runs at the next step, and how many tokens.

At every step the scheduler decides again (continuous batching, Orca; vLLM;
nano-vllm). It admits waiting requests in arrival order while the cache has
room for them, keeping a **watermark** of free blocks for the running
requests to grow into (vLLM's 1%); under the ``"static"`` policy it admits
a new batch only when the whole running batch has finished. If the cache
runs out of blocks, the request admitted last is **preempted**: its blocks
are freed and it goes back to the front of the queue, to be prefilled again
later with the tokens it has so far (vLLM's "recompute").

Two schedules: whole prefills (each admitted prompt runs at once, then every
running request decodes one token), or **chunked prefill** under a budget of
``N`` tokens per step (vLLM v1): one token of every running request (or the
next chunk of a prompt being prefilled), then chunks of new prompts. With
**prefix caching**, a new request starts with the published blocks that
hold its prompt's longest prefix of full blocks.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .request import Request
from .serving_cache import ServingCache


class Scheduler:
    """Admission, chunked prefill, preemption and prefix hits on a
    :class:`~attention_lib.serving_cache.ServingCache`.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        waiting: the queue of requests not yet running.
        running: the requests in the batch, in admission order.
        preemptions: how many times a request was preempted.
    """

    def __init__(
        self,
        cache: ServingCache,
        max_batch_size: int,
        policy: str,
        budget: int | None,
        prefix_caching: bool,
        watermark: float,
    ) -> None:
        self.cache, self.max_batch_size, self.policy = cache, max_batch_size, policy
        self.budget, self.prefix = budget, prefix_caching
        self.reserve = [int(watermark * g.num_blocks) for g in cache.groups]
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def _room(self, need: list[int], taken: list[int], reserve: bool = False) -> bool:
        """Whether every group has ``need`` more blocks after ``taken`` (and the watermark)."""
        free = self.cache.free_counts()
        extra = self.reserve if reserve and self.running else [0] * len(free)
        return all(n + t + r <= f for n, t, r, f in zip(need, taken, extra, free))

    def _fits(self, request: Request, budget: int, taken: list[int]) -> bool:
        """Whether ``request`` (not started) can be admitted now, computing at
        most ``budget`` tokens: its blocks (cached ones that are unheld leave
        the free list too) and, while others run, the watermark."""
        seen, size, hits = request.tokens(), self.cache.block_size, [[]] * len(taken)
        if self.prefix:
            hits = self.cache.match_prefix(seen[:-1].tolist())
        hit = len(hits[0])
        count = min(len(seen) - hit * size, budget)
        extra = 0 if self.budget else 1  # a whole prefill: room for its next token too
        need = self.cache.blocks_for(hit * size + count + extra)
        for g, (group, blocks) in enumerate(zip(self.cache.groups, hits)):
            unheld = sum(1 for b in blocks if group.ref_count[b] == 0)
            need[g] += unheld - hit
        return self._room(need, taken, reserve=True)

    def _start(self, request: Request) -> int:
        """Give ``request`` a sequence (with its cached prefix) and return the
        tokens it still has to compute."""
        request.seq = self.cache.new_sequence()
        seen = request.tokens()
        request.computed = request.cached = 0
        if self.prefix:  # at least its last token is computed (its logits)
            hits = self.cache.match_prefix(seen[:-1].tolist())
            request.computed = request.cached = self.cache.share_prefix(request.seq, hits)
        return len(seen) - request.computed

    def _arrived(self, step: int, closed: bool) -> Request | None:
        """The first waiting request, if it has arrived and may be admitted
        (``closed``: a static batch is running)."""
        if closed or not self.waiting or len(self.running) >= self.max_batch_size:
            return None
        return self.waiting[0] if self.waiting[0].arrival <= step else None

    def admit_whole(self, step: int, limit: int) -> Iterator[tuple[Request, int]]:
        """Whole prefills: yield each admitted request and its prompt's length,
        one at a time (the caller prefills it before the next is considered)."""
        none, closed = [0] * len(self.cache.groups), self.policy == "static" and bool(self.running)
        while (request := self._arrived(step, closed)) and self._fits(request, limit, none):
            self.waiting.popleft()
            count = self._start(request)
            self.running.append(request)
            yield request, count

    def make_room_to_decode(self) -> None:
        """Preempt the last admitted requests until every running one can grow by a token."""
        while self.running:
            need = [sum(n) for n in zip(*(self.cache.blocks_needed(r.seq, 1)
                                          for r in self.running))]  # fmt: skip
            if self._room(need, [0] * len(need)):
                return
            self.preempt()

    def schedule_chunked(self, step: int) -> list[tuple[Request, int]]:
        """Chunked prefill: the work of one step under the token budget, the
        running requests first (preempting the last admitted if blocks run
        out), then new requests' prompts."""
        work, budget, taken = [], self.budget, [0] * len(self.cache.groups)
        i = 0
        while i < len(self.running) and budget:
            request = self.running[i]
            count = min(len(request.prompt) + len(request.output) - request.computed, budget)
            need = self.cache.blocks_needed(request.seq, count)
            while not self._room(need, taken) and self.running[-1] is not request:
                self.preempt()
            if not self._room(need, taken):
                self.preempt()  # itself: the last one left to preempt
                break
            work.append((request, count))
            budget, i = budget - count, i + 1
            taken = [t + n for t, n in zip(taken, need)]
        closed = self.policy == "static" and bool(self.running)
        while (
            budget
            and (request := self._arrived(step, closed))
            and self._fits(request, budget, taken)
        ):
            self.waiting.popleft()
            count = min(self._start(request), budget)
            work.append((request, count))
            budget -= count
            taken = [t + n for t, n in zip(taken, self.cache.blocks_needed(request.seq, count))]
            self.running.append(request)
        return work

    def retire(self) -> list[Request]:
        """Free the finished requests' sequences; return them."""
        done = [r for r in self.running if r.finished]
        for request in done:
            self.cache.free_sequence(request.seq)
            request.seq = None
        self.running = [r for r in self.running if not r.finished]
        return done

    def preempt(self) -> None:
        """Free the last admitted request's blocks and queue it again, first."""
        request = self.running.pop()
        self.preemptions += 1
        self.cache.free_sequence(request.seq)
        request.seq, request.computed = None, 0
        self.waiting.appendleft(request)
