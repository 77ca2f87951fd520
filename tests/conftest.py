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


@pytest.fixture
def validation_calls():
    """``validation_calls(run)``: the calls into ``attention_lib/validation.py`` while
    ``run()`` runs. A profiler counts the frames of that file: no name is patched."""
    import sys

    from attention_lib import validation

    def count(run) -> int:
        calls = 0

        def profile(frame, event, arg):
            nonlocal calls
            calls += event == "call" and frame.f_code.co_filename == validation.__file__

        sys.setprofile(profile)
        try:
            run()
        finally:
            sys.setprofile(None)
        return calls

    return count
