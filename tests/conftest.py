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


@pytest.fixture
def hf_sdpa_mask():
    """``hf_sdpa_mask(function, q_len, k_len, q_offset=0, kv_offset=0)``: 🤗 transformers'
    dense ``(q_len, k_len)`` mask of a mask function, as its models build it for a layer
    (``sdpa_mask`` with the positions of the first query and the first stored key)."""
    from transformers.masking_utils import sdpa_mask

    def build(function, q_len: int, k_len: int, q_offset: int = 0, kv_offset: int = 0):
        return sdpa_mask(
            batch_size=1,
            q_length=q_len,
            kv_length=k_len,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=function,
            allow_is_causal_skip=False,
        )[0, 0]

    return build
