"""The check of chapter 14 and of ``torchrun -m attention_lib.distributed``.

A :class:`Case` says which distributed attention to run on which inputs;
:func:`run_cases` is the worker that runs cases on every rank,
:func:`reference` the same case in one process, :func:`gather` joins the
ranks' shards, and :func:`main` is the command-line check under ``torchrun``.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..memory import TensorMemory
from .allgather import allgather_attention
from .comm import CommStats
from .layout import zigzag_merge, zigzag_split
from .ring import ring_attention
from .ulysses import ulysses_attention, usp_attention, usp_groups

#: The distributed attentions by name, for :class:`Case`.
METHODS: dict[str, Callable[..., Tensor]] = {
    "allgather": allgather_attention,
    "ring": ring_attention,
    "ulysses": ulysses_attention,
    "usp": usp_attention,
}


@dataclass(frozen=True)
class Case:
    """One distributed attention to run and check: what, on which inputs.

    The inputs are the whole sequence, drawn from ``seed``; each rank takes its
    shard. :func:`run_cases` runs cases on the ranks, :func:`reference` computes
    the same case in one process with ``F.scaled_dot_product_attention``.

    Explained in chapter 14, *Attention across machines*.

    Attributes:
        method: ``"ring"``, ``"ulysses"``, ``"allgather"`` or ``"usp"``.
        shape: ``(B, H, N, D)`` of the whole sequence.
        is_causal: causal attention.
        layout: ``"contiguous"`` or ``"zigzag"`` (ring only).
        dtype: the dtype of the inputs.
        seed: the seed of the inputs.
        repeats: if above 0, time this many forward + backward passes.
        world_size: run on ranks ``0 .. world_size - 1`` only (a subgroup);
            ``None`` for the whole group.
        ulysses_size: for ``"usp"``, the ranks ``U`` of a row of the grid
            (:func:`usp_groups`); the case runs on the whole group.
    """

    method: str = "ring"
    shape: tuple[int, int, int, int] = (1, 4, 32, 8)
    is_causal: bool = False
    layout: str = "contiguous"
    dtype: torch.dtype = torch.float64
    seed: int = 0
    repeats: int = 0
    world_size: int | None = None
    ulysses_size: int = 2

    def inputs(self, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(q, k, v, grad_out)`` of the whole sequence, all ``(B, H, N, D)``."""
        gen = torch.Generator().manual_seed(self.seed)
        return tuple(
            torch.randn(self.shape, generator=gen, dtype=self.dtype).to(device) for _ in "qkvg"
        )

    def split(self, x: Tensor, world_size: int) -> list[Tensor]:
        """The shards of ``x`` (sequence along dim 2); contiguous shards may be uneven."""
        if self.layout == "zigzag":
            return zigzag_split(x, world_size)
        return list(torch.tensor_split(x, world_size, dim=2))

    def merge(self, shards: Sequence[Tensor]) -> Tensor:
        """The whole sequence from its shards."""
        return zigzag_merge(shards) if self.layout == "zigzag" else torch.cat(list(shards), 2)


def run_cases(cases: Sequence[Case]) -> list[dict]:
    """The worker: run every case on this rank of the default process group.

    For each case, this rank takes its shard of the inputs, runs the forward
    and backward pass, and returns its shards of the output and of the
    gradients (on the CPU), with its :class:`CommStats` of the forward and the
    backward pass, the peak bytes of every tensor the forward pass allocated
    (``peak_bytes``, chapter 11's :class:`~attention_lib.memory.TensorMemory`) and, if
    ``case.repeats``, the mean wall time of a forward +
    backward pass (between barriers, so the slowest rank's time). A case whose
    shards are refused gives ``{"error": message}`` and the group goes on.

    Explained in chapter 14, *Attention across machines*.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    groups = {}  # every rank creates every subgroup, in the same order
    for size in sorted({case.world_size or world for case in cases}):
        groups[size] = None if size == world else dist.new_group(list(range(size)))
    grids = {u: usp_groups(u) for u in sorted({c.ulysses_size for c in cases if c.method == "usp"})}
    results = []
    for case in cases:
        size = case.world_size or world
        if rank >= size:  # not in this case's group
            results.append(None)
            continue
        kwargs = {"layout": case.layout} if case.layout != "contiguous" else {}
        kwargs["group"] = groups[size]
        if case.method == "usp":  # a grid of rows (Ulysses) and columns (rings)
            kwargs = dict(zip(("ulysses_group", "ring_group"), grids[case.ulysses_size]))
        attention = METHODS[case.method]
        q, k, v, g = (case.split(t, size)[rank] for t in case.inputs(device))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        stats = CommStats()
        try:
            with TensorMemory() as memory:  # everything the forward pass allocates
                out = attention(q, k, v, is_causal=case.is_causal, stats=stats, **kwargs)
        except (TypeError, ValueError) as error:
            results.append({"error": f"{type(error).__name__}: {error}"})
            continue
        forward = replace(stats)  # the backward pass adds to `stats`
        grads = torch.autograd.grad(out, (q, k, v), g)
        result = {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        result = {name: t.cpu() for name, t in result.items()}
        result.update(forward=forward, total=stats, peak_bytes=memory.peak, seconds=None)
        if case.repeats:
            dist.barrier(group=groups[size])
            start = time.perf_counter()
            for _ in range(case.repeats):
                out = attention(q, k, v, is_causal=case.is_causal, **kwargs)
                torch.autograd.grad(out, (q, k, v), g)
            dist.barrier(group=groups[size])
            result["seconds"] = (time.perf_counter() - start) / case.repeats
        results.append(result)
    return results


def reference(case: Case) -> dict[str, Tensor]:
    """The case in one process: ``F.scaled_dot_product_attention`` and autograd.

    Returns the whole output and the gradients of q, k, v (``"out"``,
    ``"dq"``, ``"dk"``, ``"dv"``), the oracle for :func:`gather`.

    Explained in chapter 14, *Attention across machines*.
    """
    q, k, v, g = case.inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal)
    grads = torch.autograd.grad(out, (q, k, v), g)
    return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}


def gather(case: Case, per_rank: Sequence[dict]) -> dict[str, Tensor]:
    """Join the ranks' shards of one case's output and gradients into whole tensors.

    Explained in chapter 14, *Attention across machines*.
    """
    return {name: case.merge([r[name] for r in per_rank]) for name in ("out", "dq", "dk", "dv")}


def torchrun_cases(world: int) -> list[Case]:
    """What :func:`main` checks on ``world`` ranks: both methods, causal and not, both
    layouts, two dtypes, on a sequence of ``8 P`` positions (so any ``P`` divides it)."""
    kinds = (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous"))
    grid = [(m, c, lay, dt) for dt in (torch.float64, torch.float32) for c in (False, True)
            for m, lay in kinds]  # fmt: skip
    return [
        Case(m, (1, 4, 8 * world, 8), c, lay, dt, seed=i) for i, (m, c, lay, dt) in enumerate(grid)
    ]


#: The tolerance of every check, by dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _max_errors(case: Case, per_rank: Sequence[dict]) -> dict[str, float]:
    """The largest absolute difference from :func:`reference` of the gathered
    output and gradients of one case."""
    got, want = gather(case, [r for r in per_rank if r is not None]), reference(case)
    return {name: (got[name] - want[name]).abs().max().item() for name in want}


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node P -m attention_lib.distributed``: check every case.

    Joins the group torchrun describes (NCCL with GPUs, else gloo), runs
    :func:`torchrun_cases` on every rank, gathers the shards on rank 0, which
    prints each case's largest errors against the single-process reference and
    returns 1 if any is above :data:`TOLERANCE`.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per collective")
    args = parser.parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        cases = torchrun_cases(dist.get_world_size())
        results = run_cases(cases)
        everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(results, everyone, dst=0)
        if dist.get_rank() != 0:
            return 0
        world, failed = dist.get_world_size(), 0
        print(f"P = {world}, backend {backend}: largest |error| against one process")
        for i, case in enumerate(cases):
            per_rank = [r[i] for r in everyone]
            if "error" in per_rank[0]:
                print(f"{case.method:8} {case.layout:10} refused: {per_rank[0]['error']}")
                continue
            worst = max(_max_errors(case, per_rank).values())
            failed += worst > TOLERANCE[case.dtype]
            causal = "causal" if case.is_causal else "full"
            print(f"{case.method:8} {case.layout:10} {causal:6} {case.dtype!s:13} {worst:.1e}")
        print("all exact" if not failed else f"{failed} case(s) above the tolerance")
        return int(failed > 0)
    finally:
        dist.destroy_process_group()
