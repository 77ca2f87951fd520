"""Shared pytest configuration for the unit tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    """The unit tests use tiny tensors: intra-op threads only add overhead, and on a
    busy 2-core machine their synchronisation made the suite several times slower.
    One thread also makes the small training runs in the tests reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
