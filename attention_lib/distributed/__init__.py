"""Attention across machines: ring attention and DeepSpeed-Ulysses on torch.distributed.

When one sequence no longer fits one device, each of ``P`` processes holds
``N / P`` of its positions: a shard ``(B, H, N/P, D)`` of the queries, keys and
values. Two ways to compute exact attention over the whole sequence:

* **Ring attention** (Liu et al., 2023): the K/V shards travel round a ring of
  the ranks, one hop per step; each rank attends its queries to the block it
  holds and merges the partial results through their log-sum-exp, exactly the
  online softmax of chapter 11. After ``P`` steps every query has seen every
  key, and no rank ever held more than two K/V blocks. The backward pass sends
  the blocks round again, with their gradients ``dK``/``dV`` travelling along
  and arriving home after ``P`` steps.
* **DeepSpeed-Ulysses** (Jacobs et al., 2023): an all-to-all turns the
  sequence split into a head split (each rank gets the whole sequence for
  ``H / P`` heads), attention runs locally, and a second all-to-all turns it
  back. It needs ``H`` divisible by ``P``.
* **Ulysses x ring** (USP): ``P = U x R`` ranks in a grid, Ulysses'
  all-to-all in each row of ``U``, the ring down each column of ``R``
  (:func:`usp_attention`, groups from :func:`usp_groups`).

The functions run inside the caller's process group (the default one when
``group=None``): they never create or destroy one. :func:`launch` starts
``P`` local processes with a gloo (CPU) or NCCL (GPU) group for a worker
function such as :func:`run_cases`, for the book's notebook and the tests;
under ``torchrun --nproc-per-node P`` the command-line entry
``python -m attention_lib.distributed`` runs the same check.

The package, one concept per module (every name below is importable from
``attention_lib.distributed`` itself):

* the algorithms: ``layout`` (contiguous and zig-zag shards), ``comm`` (a
  rank in its group: sends, counts, the agreement on shard shapes),
  ``ring`` (ring attention), ``ulysses`` (DeepSpeed-Ulysses and USP), ``allgather``
  (gathering first);
* running them: ``launcher`` (:func:`launch`) and ``cases`` (the check:
  :class:`Case`, :func:`run_cases`, :func:`reference`, :func:`gather` and the
  ``torchrun`` entry :func:`main`, which ``__main__`` calls).

Explained in chapter 14, *Attention across machines*.
"""

# Re-exported: `from attention_lib.distributed import ...` reaches every public name.
from .allgather import allgather_attention  # noqa: F401
from .cases import (  # noqa: F401
    METHODS,
    TOLERANCE,
    Case,
    gather,
    main,
    reference,
    run_cases,
    torchrun_cases,
)
from .comm import CommStats  # noqa: F401
from .launcher import free_port, launch  # noqa: F401
from .layout import LAYOUTS, zigzag_merge, zigzag_split  # noqa: F401
from .ring import ring_attention, ring_blocks_per_rank  # noqa: F401
from .ulysses import ulysses_attention, usp_attention, usp_groups  # noqa: F401
