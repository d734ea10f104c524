"""MARS block-training inputs and attention masks (docs/design.md §2.1). Pure functions; imports only torch.

MARS (Jin, Wang, Luo, Sun, arXiv 2604.07023) trains an ordinary causal LM to fill K placeholder
tokens in one pass. A training example of length L (a multiple of K) becomes one sequence of length
2L, ``[noisy | clean]``:

- ``noisy`` = the example with every response token replaced by the placeholder ``M``;
- ``clean`` = the example itself;
- position ids ``[0..L-1, 0..L-1]``: each stream restarts at 0, so a noisy token and the clean token
  it stands for share a rotary position.

With ``p`` the index of a token within its stream and ``β(p) = p // K`` its block, a query may attend
a key (True = may attend) iff

- clean → clean: ``p_k ≤ p_q`` (causal);
- noisy → noisy: ``β_k = β_q`` and ``p_k ≤ p_q`` (causal inside the block);
- noisy → clean: ``β_k < β_q`` (every earlier block, clean);
- clean → noisy: never.

So the noisy token at ``p`` sees exactly what the model sees at inference when it reads
``[context, M × K]`` with a plain causal mask: the clean tokens before its block, then the block's
placeholders up to itself.

The same rule is available three ways: a dense boolean matrix (:func:`block_attention_allowed`), the
float additive 4D mask that transformers' eager and sdpa attention take
(:func:`block_attention_bias`), and a FlexAttention ``mask_mod`` (:func:`block_mask_mod`) from which
``torch.nn.attention.flex_attention.create_block_mask`` builds a sparse ``BlockMask`` on GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from prove.data.chat import IGNORE_INDEX


def padded_length(length: int, block_size: int) -> int:
    """The smallest multiple of ``block_size`` that is ≥ ``length``."""
    if block_size < 1:
        raise ValueError(f"block_size must be ≥ 1, got {block_size}")
    return -(-length // block_size) * block_size


def block_attention_allowed(
    length: int, block_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean ``(2L, 2L)`` matrix, True where query (row) may attend key (column).

    Rows/columns ``0..L-1`` are the noisy stream, ``L..2L-1`` the clean stream. ``length`` (L) is one
    stream's length; it need not be a multiple of ``block_size`` (the last block is then short).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be ≥ 1, got {block_size}")
    p = torch.arange(length, device=device)
    blk = p // block_size
    causal = p[None, :] <= p[:, None]  # (L, L) key ≤ query
    same_block = blk[None, :] == blk[:, None]  # (L, L)
    earlier_block = blk[None, :] < blk[:, None]  # (L, L)
    noisy_noisy = causal & same_block
    noisy_clean = earlier_block
    clean_noisy = torch.zeros_like(causal)
    clean_clean = causal
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)  # (L, 2L) noisy queries
    bottom = torch.cat([clean_noisy, clean_clean], dim=1)  # (L, 2L) clean queries
    return torch.cat([top, bottom], dim=0)  # (2L, 2L)


def block_attention_bias(
    length: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Float additive mask ``(1, 1, 2L, 2L)``: 0 where attention is allowed, ``finfo(dtype).min`` elsewhere.

    transformers 5.x passes a 4D mask straight to the attention kernel; eager attention *adds* it to
    the scores, so it must be additive (a boolean 4D mask is silently wrong under eager). The leading
    ``(1, 1)`` broadcasts over batch and heads: the mask depends only on L and K, and per-example padding
    to a multiple of K keeps batch padding in blocks of its own that no real token attends.
    """
    allowed = block_attention_allowed(length, block_size, device=device)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[None, None]  # (1, 1, 2L, 2L)


def block_mask_mod(length: int, block_size: int) -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for the same rule over the 2L sequence.

    Build a sparse mask with
    ``create_block_mask(block_mask_mod(L, K), B=None, H=None, Q_LEN=2 * L, KV_LEN=2 * L)``; it only
    uses elementwise tensor ops, so it vmaps/compiles.
    """

    def mask_mod(b, h, q_idx, kv_idx):
        q_noisy = q_idx < length
        k_noisy = kv_idx < length
        q_p = torch.where(q_noisy, q_idx, q_idx - length)
        k_p = torch.where(k_noisy, kv_idx, kv_idx - length)
        q_blk = q_p // block_size
        k_blk = k_p // block_size
        causal = k_p <= q_p
        nn = q_noisy & k_noisy & causal & (q_blk == k_blk)
        nc = q_noisy & ~k_noisy & (k_blk < q_blk)
        cc = ~q_noisy & ~k_noisy & causal
        return nn | nc | cc

    return mask_mod


def mars_attention_mask(
    impl: str | None, length: int, block_size: int, dtype: torch.dtype, device: Any
) -> Any:
    """The mask a MARS step gives a model whose attention is ``impl``: a FlexAttention ``BlockMask`` under
    ``flex_attention``, else the float additive 4D mask (:func:`block_attention_bias`)."""
    if impl == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(
            block_mask_mod(length, block_size), None, None, 2 * length, 2 * length, device=device
        )
    return block_attention_bias(length, block_size, dtype=dtype, device=device)


def block_inputs(
    input_ids: torch.Tensor, labels: torch.Tensor, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2L training input ``[noisy | clean]`` and its position ids ``[0..L-1, 0..L-1]``.

    ``input_ids``, ``labels``: ``(B, L)``, labels ``-100`` on the prompt (and on batch padding).
    Returns ``(ids, position_ids)``, each ``(B, 2L)``.
    """
    noisy = torch.where(
        labels != IGNORE_INDEX, torch.full_like(input_ids, mask_token_id), input_ids
    )  # (B, L)
    ids = torch.cat([noisy, input_ids], dim=1)  # (B, 2L)
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)
    position_ids = torch.cat([pos, pos])[None].expand(input_ids.shape[0], -1)  # (B, 2L)
    return ids, position_ids
