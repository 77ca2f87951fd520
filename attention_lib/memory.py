"""Counting the tensor memory that PyTorch code allocates: :class:`TensorMemory`.

A ``with TensorMemory() as memory:`` block watches every ATen operation that
runs inside it, including the ones of the autograd backward pass, and adds up
the bytes of every *new* tensor storage they return; when the last reference to
a storage goes away, its bytes are subtracted again. ``memory.peak`` is the
largest total alive at any moment. It sees what PyTorch's operators allocate as
results (and what autograd saves), not the private scratch space inside a fused
kernel, and not memory that existed before the block.

Explained in chapter 11, *Efficient attention*.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_MiB = 2**20


class TensorMemory(TorchDispatchMode):
    """Peak and live bytes of the tensor storages allocated inside a ``with`` block.

    A view (``x.T``, ``x[1:]``, ``x.expand(...)``) shares its storage and an
    in-place or ``out=`` operation writes into an existing one, so neither counts;
    every storage is counted once, however many tensors use it. Works under
    ``torch.no_grad()``/``torch.inference_mode()`` and through ``backward()``.

    Explained in chapter 11, *Efficient attention*.

    Attributes:
        peak: the largest number of bytes alive at once since ``__enter__``.
        live: bytes allocated in the block and still alive.

    Example:
        >>> x = torch.randn(1000)
        >>> with TensorMemory() as memory:
        ...     y = x * 2  # a new 4000-byte storage
        ...     z = y[10:]  # a view: nothing new
        ...     del y, z
        >>> memory.peak, memory.live
        (4000, 0)
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing here is compiled: without this, PyTorch wraps __torch_dispatch__
        # in torch._dynamo.disable, whose first call imports torch._dynamo (seconds).
        return False

    def __enter__(self) -> TensorMemory:
        self.peak = self.live = 0
        # data_ptr -> (token, bytes) of every storage alive that we counted; the
        # token tells a storage apart from a later one at the same address.
        self._storages: dict[int, tuple[int, int]] = {}
        self._tokens = itertools.count()
        return super().__enter__()

    @property
    def peak_mib(self) -> float:
        """:attr:`peak` in MiB."""
        return self.peak / _MiB

    def _release(self, ptr: int, token: int, nbytes: int) -> None:
        self.live -= nbytes
        if self._storages.get(ptr, (None, 0))[0] == token:
            del self._storages[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(result):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if ptr in self._storages or ptr in inputs or nbytes == 0:
                continue  # counted already, a view or in-place result, or empty
            token = next(self._tokens)
            self._storages[ptr] = (token, nbytes)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            # PyTorch keeps a storage's Python object alive as long as the storage,
            # so this runs when the memory is really given back.
            weakref.finalize(storage, self._release, ptr, token, nbytes)
        return result
