"""The MARS block attention mask against a position-by-position reference (docs/design.md §2.1)."""

from __future__ import annotations

import pytest
import torch
from prove.train.collate import Collator
from prove.train.masks import (
    block_attention_allowed,
    block_attention_bias,
    block_inputs,
    block_mask_mod,
    padded_length,
)


def reference_allowed(length: int, k: int) -> torch.Tensor:
    """Brute force: one rule per (query, key) pair, written out from the spec."""
    out = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for kv in range(2 * length):
            q_noisy, k_noisy = q < length, kv < length
            pq, pk = q % length, kv % length
            if not q_noisy and not k_noisy:
                ok = pk <= pq
            elif q_noisy and k_noisy:
                ok = pk // k == pq // k and pk <= pq
            elif q_noisy and not k_noisy:
                ok = pk // k < pq // k
            else:
                ok = False
            out[q, kv] = ok
    return out


CASES = [(1, 1), (4, 1), (4, 2), (6, 3), (7, 3), (8, 4), (10, 4), (13, 8), (16, 16), (5, 8)]


@pytest.mark.parametrize("length,k", CASES)
def test_allowed_matches_reference(length, k):
    assert torch.equal(block_attention_allowed(length, k), reference_allowed(length, k))


@pytest.mark.parametrize("length,k", CASES)
def test_mask_mod_matches_reference(length, k):
    q = torch.arange(2 * length)[:, None]
    kv = torch.arange(2 * length)[None, :]
    got = block_mask_mod(length, k)(0, 0, q, kv)
    assert torch.equal(got, reference_allowed(length, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_is_additive_float(dtype):
    bias = block_attention_bias(6, 3, dtype=dtype)
    assert bias.shape == (1, 1, 12, 12) and bias.dtype == dtype
    allowed = reference_allowed(6, 3)
    assert torch.all(bias[0, 0][allowed] == 0)
    assert torch.all(bias[0, 0][~allowed] == torch.finfo(dtype).min)
    # every query attends at least itself, so softmax rows are never all-masked
    assert torch.all(bias[0, 0].diagonal() == 0)


def test_unpadded_length_padded_by_collator_matches_reference():
    """L = 7 is not a multiple of K = 3: the collator pads to 9 with labelled EOS, then the mask is the reference at 9."""
    rows = [
        {"input_ids": [5, 6, 7, 8, 9, 10, 11], "labels": [-100, -100, -100, 8, 9, 10, 11]},
        {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]},
    ]
    batch = Collator(pad_token_id=0, eos_token_id=2, block_size=3)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 2, 2], [5, 6, 7, 8, 2, 2, 0, 0, 0]]
    assert batch["labels"].tolist() == [
        [-100, -100, -100, 8, 9, 10, 11, 2, 2],
        [-100, -100, 7, 8, 2, 2, -100, -100, -100],
    ]
    length = batch["input_ids"].shape[1]
    assert length == padded_length(7, 3) == 9
    assert torch.equal(block_attention_allowed(length, 3), reference_allowed(length, 3))
    # real tokens never attend batch padding (it fills whole blocks of its own, after every real block)
    allowed = block_attention_allowed(length, 3)
    real = torch.cat([batch["attention_mask"][1], batch["attention_mask"][1]]).bool()
    assert not allowed[real][:, ~real].any()


def test_block_inputs():
    ids = torch.tensor([[5, 6, 7, 8]])
    labels = torch.tensor([[-100, -100, 7, 8]])
    x, pos = block_inputs(ids, labels, mask_token_id=99)
    assert x.tolist() == [[5, 6, 99, 99, 5, 6, 7, 8]]
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        block_attention_allowed(4, 0)
    with pytest.raises(ValueError, match="eos_token_id"):
        Collator(pad_token_id=0, eos_token_id=None, block_size=4)
