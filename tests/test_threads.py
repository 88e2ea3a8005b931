"""heedful.threads: the torch thread count for one block of work (the happy path is its doctest)."""

from __future__ import annotations

import pytest
import torch

from heedful.threads import torch_threads


def test_the_callers_thread_count_comes_back_when_the_block_raises() -> None:
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"), torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
