"""The comparison helpers every cross-kernel test uses (tests/numerics.py): the bound holds for a real reordering of
fp32 sums and rejects what a mistake moves, and the argmax check ignores ties only."""

from __future__ import annotations

import pytest
import torch

from tests.numerics import assert_same_function, fp32_tol


def test_the_bound_covers_a_reordered_gemm_and_rejects_a_real_change():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 512, generator=g), torch.randn(512, 300, generator=g)
    one = a @ b  # (16, 300)
    chunked = sum(a[:, i : i + 7] @ b[i : i + 7] for i in reversed(range(0, 512, 7)))  # another order
    assert not torch.equal(one, chunked)  # the orders do differ
    assert_same_function(chunked, one, reduction=512, depth=1)
    # a mistake's size (one term of 512 dropped) is far outside it
    with pytest.raises(AssertionError, match="fp32 bound"):
        assert_same_function(one - a[:, :1] @ b[:1], one, reduction=512, depth=1)


def test_the_bound_scales_with_the_values_and_the_depth():
    assert fp32_tol(torch.tensor([0.5]), reduction=128, depth=5) == pytest.approx(5 * 256 * 2**-24)
    assert fp32_tol(torch.tensor([-8.0]), reduction=128, depth=5) == pytest.approx(8 * 5 * 256 * 2**-24)


def test_a_tie_within_the_bound_may_break_either_way():
    tol = fp32_tol(torch.tensor([1.0]), reduction=64, depth=1)
    want = torch.tensor([[1.0, 0.2, 0.1], [0.5, 0.5 + tol / 2, 0.0]])
    tied = want.clone()
    tied[1, 0] += tol  # the second row's top two swap within the bound: either argmax is right
    assert_same_function(tied, want, reduction=64, depth=1)
