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
from dataclasses import dataclass
from typing import Any

import torch
from prove.data.chat import IGNORE_INDEX

BLOCK_ATTENTION = "prove_mars_sdpa"
"""The attention implementation of :mod:`prove.train.attention` (registered there with transformers): sdpa, except
that it reads a mask of the noisy rows only (:func:`trimmed_noisy_bias`) and runs the clean stream causally."""


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


# -- the trimmed input: only the noisy blocks that carry a target -----------------------------------------------


def first_target_block(labels: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per example ``(B,)``: the first noisy block with a target, ``(P - 1) // K``, P the first response position.

    The output at P − 1 predicts the first response token (a depth-1 target), so when P is a multiple of K the
    block holding P − 1 (the prompt's last block) is kept, not block P // K. An example without a target gets the
    block past its end (nothing kept)."""
    has = labels != IGNORE_INDEX  # (B, L)
    length = labels.shape[1]
    idx = torch.arange(length, device=labels.device).expand_as(labels)
    first = torch.where(has, idx, torch.full_like(idx, length)).min(dim=1).values  # (B,) P, or L when none
    return torch.where(first < length, (first - 1).clamp(min=0) // block_size, -(-length // block_size))


def noisy_depth(stream_index: torch.Tensor, first_response: torch.Tensor, block_size: int) -> torch.Tensor:
    """The decode depth of noisy outputs at ``stream_index`` (any shape, with ``first_response`` broadcast to it: P of
    each output's example): 1 + the placeholders in its block up to and with it, i.e. ``p − max(β(p)·K, P) + 2`` for
    a response position p, and 1 for the output at P − 1 (ordinary next-token prediction, the block's first proposal).

    A block wholly inside the response gives depths 2..K + 1 (:mod:`prove.train.acceptance`: depth d of the cycle that
    starts at the block is the noisy output at s + d − 2); the block holding the boundary counts from P."""
    start = (stream_index // block_size) * block_size
    return (stream_index - torch.maximum(start, first_response) + 2).clamp(min=1)


@dataclass(frozen=True)
class TrimmedInputs:
    """The input ``[noisy blocks from (P − 1) // K on | clean]`` of a batch, right-padded per example.

    Column c < N is noisy stream index ``start_b + c`` of example b (from ``start_b = K · (P_b − 1) // K``); columns
    N.. are the clean stream (index c − N). Noisy columns past an example's own length are padding: they sit in
    blocks of their own past its end, so no real query attends them, and carry no target.
    """

    ids: torch.Tensor
    """``(B, N + L)`` token ids."""
    position_ids: torch.Tensor
    """``(B, N + L)``: each token's index in its stream (a placeholder and the token it stands for share one)."""
    stream_index: torch.Tensor
    """``(B, N + L)``: p, the index within its stream the attention rule reads (padding continues past the end)."""
    noisy_len: int
    """N, the noisy columns (the longest kept noisy part of the batch, a multiple of K)."""
    starts: torch.Tensor
    """``(B,)`` the first kept noisy stream index of each example."""

    @property
    def is_noisy(self) -> torch.Tensor:
        """``(B, N + L)`` True on the noisy columns."""
        cols = torch.arange(self.ids.shape[1], device=self.ids.device)
        return (cols < self.noisy_len).expand_as(self.ids)


def trimmed_inputs(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None,
    mask_token_id: int,
    block_size: int,
) -> TrimmedInputs:
    """:func:`block_inputs` without the noisy blocks before ``(P − 1) // K``: nothing outside a noisy block attends
    it and no target lies in it, so every output with a target is unchanged (docs/design.md §2.1).

    ``input_ids``, ``labels``, ``attention_mask``: ``(B, L)`` as :class:`prove.train.collate.Collator` makes them
    (each example a multiple of K long; ``attention_mask`` None: no batch padding)."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    lengths = (
        attention_mask.sum(dim=1) if attention_mask is not None else torch.full((bsz,), length, device=dev)
    )  # (B,) each example's own (block-padded) length
    starts = (first_target_block(labels, block_size) * block_size).minimum(lengths)  # (B,)
    n = int((lengths - starts).max().item()) if bsz else 0
    cols = torch.arange(n, device=dev)
    p_noisy = starts[:, None] + cols[None, :]  # (B, N) stream index of each noisy column
    real = p_noisy < lengths[:, None]  # (B, N)
    gather = p_noisy.clamp(max=length - 1)
    src_ids = input_ids.gather(1, gather)  # (B, N)
    src_lab = labels.gather(1, gather)  # (B, N)
    noisy = torch.where(real & (src_lab != IGNORE_INDEX), torch.full_like(src_ids, mask_token_id), src_ids)
    noisy = torch.where(real, noisy, torch.full_like(src_ids, mask_token_id))  # padding: any id, never read
    pos = torch.arange(length, device=dev).expand(bsz, -1)  # (B, L)
    return TrimmedInputs(
        ids=torch.cat([noisy, input_ids], dim=1),
        position_ids=torch.cat([gather, pos], dim=1),
        stream_index=torch.cat([p_noisy, pos], dim=1),
        noisy_len=n,
        starts=starts,
    )


def trimmed_targets(labels: torch.Tensor, inputs: TrimmedInputs) -> torch.Tensor:
    """``(B, N + L)``: the label each output of :func:`trimmed_inputs` predicts (the next token of its stream), −100
    where none (the prompt, padding, a stream's last index)."""
    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)  # (B, L)
    length = labels.shape[1]
    p = inputs.stream_index[:, : inputs.noisy_len]
    noisy_t = shifted.gather(1, p.clamp(max=length - 1))
    noisy_t = torch.where(p < length, noisy_t, torch.full_like(noisy_t, IGNORE_INDEX))
    return torch.cat([noisy_t, shifted], dim=1)


def trimmed_attention_allowed(
    inputs: TrimmedInputs, block_size: int, queries: int | None = None
) -> torch.Tensor:
    """Boolean ``(B, Q, T)`` (T = N + L; Q = ``queries``, the first rows only, else T), True where query may attend
    key: the rule of :func:`block_attention_allowed` on each example's stream indices."""
    p = inputs.stream_index  # (B, T)
    noisy = inputs.is_noisy  # (B, T)
    blk = p // block_size
    q = slice(None) if queries is None else slice(0, queries)
    pq, pk = p[:, q, None], p[:, None, :]
    nq, nk = noisy[:, q, None], noisy[:, None, :]
    bq, bk = blk[:, q, None], blk[:, None, :]
    causal = pk <= pq
    nn = nq & nk & causal & (bq == bk)
    nc = nq & ~nk & (bk < bq)
    cc = ~nq & ~nk & causal
    return nn | nc | cc


def trimmed_attention_bias(
    inputs: TrimmedInputs, block_size: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Float additive mask ``(B, 1, T, T)`` of :func:`trimmed_attention_allowed` (eager and sdpa)."""
    allowed = trimmed_attention_allowed(inputs, block_size)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


def trimmed_noisy_bias(
    inputs: TrimmedInputs, block_size: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``(B, 1, N, T)``: the noisy queries' rows of :func:`trimmed_attention_bias`, the mask of the block attention
    (:data:`BLOCK_ATTENTION`, :mod:`prove.train.attention`), whose clean queries read the clean stream causally and
    need no mask: N · (N + L) entries instead of (N + L)²."""
    allowed = trimmed_attention_allowed(inputs, block_size, queries=inputs.noisy_len)  # (B, N, T)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


def trimmed_mask_mod(inputs: TrimmedInputs, block_size: int) -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of the same per-example rule (``create_block_mask(mod,
    B=batch, H=None, Q_LEN=T, KV_LEN=T)``).

    Written on column indices: inside the noisy part, blocks and causality read the same on columns as on stream
    indices (each example's part starts on a block boundary), so only noisy → clean needs the example's first kept
    block, one captured ``(B,)`` tensor (``starts // K``)."""
    n, k = inputs.noisy_len, block_size
    first_block = inputs.starts // k  # (B,)

    def mask_mod(b, h, q_idx, kv_idx):
        q_noisy, k_noisy = q_idx < n, kv_idx < n
        causal = kv_idx <= q_idx
        nn = q_noisy & k_noisy & causal & (q_idx // k == kv_idx // k)
        nc = q_noisy & ~k_noisy & ((kv_idx - n) // k < first_block[b] + q_idx // k)
        cc = ~q_noisy & ~k_noisy & causal
        return nn | nc | cc

    return mask_mod


def trimmed_attention_mask(
    impl: str | None, inputs: TrimmedInputs, block_size: int, dtype: torch.dtype
) -> Any:
    """The mask for a model whose attention is ``impl``: a FlexAttention ``BlockMask`` under ``flex_attention``; the
    noisy rows (:func:`trimmed_noisy_bias`) under :data:`BLOCK_ATTENTION` (``None``, the causal clean stream, when no
    noisy column is kept); else :func:`trimmed_attention_bias`."""
    if impl == BLOCK_ATTENTION:
        return trimmed_noisy_bias(inputs, block_size, dtype) if inputs.noisy_len else None
    if impl == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        t = inputs.ids.shape[1]
        return create_block_mask(
            trimmed_mask_mod(inputs, block_size), inputs.ids.shape[0], None, t, t, device=inputs.ids.device
        )
    return trimmed_attention_bias(inputs, block_size, dtype=dtype)
