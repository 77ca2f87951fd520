"""Start ``P`` local processes in one process group and run a worker function on each.

For the book's notebook and the tests (gloo on the CPU, NCCL on GPUs, on
127.0.0.1); under ``torchrun`` the processes exist already and
:func:`~attention_lib.distributed.cases.main` joins their group instead.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..validation import check_int, check_real


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it: bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, backend: str | None, timeout: float, out_dir: str,
           threads: int, worker: Callable, args: tuple) -> None:  # fmt: skip
    """One spawned process: join the group, run the worker, save what it returns."""
    torch.set_num_threads(threads)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    try:
        torch.save(worker(*args), os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(
    worker: Callable,
    world_size: int,
    *args: object,
    backend: str | None = None,
    timeout: float = 120.0,
    threads: int = 1,
) -> list:
    """Run ``worker(*args)`` in ``world_size`` new processes of one process group.

    The processes are started with ``torch.multiprocessing`` (the ``spawn``
    start method, so it works from a notebook as from a script); each joins a
    new default group on 127.0.0.1 at a free port (gloo on CPUs, NCCL when
    there are GPUs, one per rank), calls ``worker(*args)``, saves what it
    returns and leaves the group. ``worker`` must be importable (defined in a
    module, such as :func:`run_cases`), not defined in a notebook cell.

    Nothing can hang: the group's collectives time out after ``timeout``
    seconds, and if the processes have not all finished by then they are
    terminated and a ``TimeoutError`` is raised. An exception in a worker is
    raised here (``torch.multiprocessing.ProcessRaisedException``).

    Explained in chapter 14, *Attention across machines*.

    Args:
        worker: an importable function, run on every rank.
        world_size: the number of processes ``P``.
        *args: the worker's arguments (pickled to every process).
        backend: ``"gloo"``, ``"nccl"`` or ``None`` for NCCL if CUDA is
            available, else gloo.
        timeout: seconds for the whole run and for any one collective.
        threads: ``torch.set_num_threads`` in every process.

    Returns:
        What the worker returned, one entry per rank, in rank order.
    """
    world = check_int("world_size", world_size, minimum=1)
    timeout = check_real("timeout", timeout, above=0)
    with tempfile.TemporaryDirectory() as out_dir:
        args = (world, free_port(), backend, timeout, out_dir, threads, worker, args)
        context = mp.start_processes(_entry, args, nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the {world} workers did not end in timeout={timeout:g} s")
        finally:
            for process in context.processes:  # only the processes started above
                if process.is_alive():
                    process.terminate()
        return [
            torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)
        ]
