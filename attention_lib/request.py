"""A request to the serving engine and the latency its user sees.

A request (:class:`Request`) is a prompt, a limit of new tokens and maybe an
end-of-sequence token; while the engine serves it, it records how far its
tokens went through the model and the steps of its first and last tokens.
From those and the engine's step times come its **time to first token**
(TTFT) and **time per output token** (TPOT, :class:`Latency`), what a
server's user sees.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor


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
        seq: its sequence id in the engine's cache while it runs
            (``None`` while it waits or after it finished).
        computed: tokens the cache has run through the model (a prompt
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

    def pending(self, count: int) -> list[int]:
        """The ``count`` tokens after the ``computed`` ones."""
        start = self.computed - len(self.prompt)
        if start >= 0:  # decoding: from the output list, without building tokens()
            return self.output[start : start + count]
        return self.tokens()[self.computed : self.computed + count].tolist()

    def record(self, token: int, step: int) -> None:
        """Append the token produced at ``step``."""
        self.output.append(token)
        if self.first_step is None:
            self.first_step = step
        self.last_step = step


class Latency(NamedTuple):
    """What a request's user sees (chapter 12): time to first token (TTFT),
    from its arrival to the end of the step that produced its first token,
    and time per output token (TPOT), the mean gap between its later tokens
    (``nan`` with one token); in engine steps and in seconds."""

    ttft_steps: int
    tpot_steps: float
    ttft_seconds: float
    tpot_seconds: float

    @classmethod
    def of(cls, request: Request, times: list[tuple[float, float]]) -> Latency:
        """The latency of a finished ``request`` given the ``(start, end)``
        time of every engine step.

        Raises:
            ValueError: if ``request`` has no token yet.
        """
        if request.first_step is None or request.last_step is None:
            raise ValueError("the request has produced no token yet")
        arrival = times[request.arrival][0]
        first, last = times[request.first_step][1], times[request.last_step][1]
        gaps = len(request.output) - 1
        return cls(
            request.first_step - request.arrival + 1,
            (request.last_step - request.first_step) / gaps if gaps else float("nan"),
            first - arrival,
            (last - first) / gaps if gaps else float("nan"),
        )
