"""MARS's block attention on the CPU without a dense mask over the whole trimmed input (docs/design.md §2.1, "On the
CPU").

The trimmed MARS input is ``[noisy | clean]``, N + L columns (:func:`prove.train.masks.trimmed_inputs`). Under the
block rule (:mod:`prove.train.masks`) a clean query never reads a noisy key, so the clean stream is an ordinary causal
sequence of its own; a noisy query reads only its own block (causally) and the clean prefix before that block.
:data:`BLOCK_ATTENTION` names an attention function, registered with transformers' ``AttentionInterface`` (and sdpa's
mask function under the same name with ``AttentionMaskInterface``), that computes the two parts with
``scaled_dot_product_attention`` and never visits a block the rule masks whole:

1. the clean queries against the clean keys, ``is_causal`` (no mask at all): L²/2;
2. the noisy queries in chunks of whole rows (:func:`noisy_chunks`): each chunk against the keys its rows may read —
   the noisy columns of its own blocks and the clean prefix up to its last block's start — under the matching slice
   of the noisy rows' mask (:func:`prove.train.masks.trimmed_noisy_bias`, ``(B, 1, N, N + L)``). A noisy block's
   neighbours, and the clean stream past the chunk, are never read: N · (chunk + prefix) instead of N · (N + L).

The chunks are read off the mask itself (the key columns any of a chunk's rows may attend), so they are exact for any
block size or batch layout, computed once per mask (every layer, and every step the trainer's mask cache repeats,
reads the same plan).

The function reads the split from the mask it is given: a 4D mask with fewer query rows (N) than the layer has
queries (N + L) is a MARS noisy-rows mask. Every mask transformers itself builds has one row per query (or one row
for one query), so with any other input the function is transformers' sdpa attention unchanged: a model switched to
it (:func:`use_block_attention`) decodes, evaluates and saves as under ``sdpa`` (``save_pretrained`` does not write
the attention implementation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from prove.train.masks import BLOCK_ATTENTION
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def is_noisy_rows_mask(attention_mask: Any, query_len: int) -> bool:
    """True when ``attention_mask`` is a MARS noisy-rows mask for a layer with ``query_len`` queries: a 4D tensor whose
    query dimension is shorter than the queries (and ≥ 1), whose key dimension covers them all."""
    return (
        isinstance(attention_mask, torch.Tensor)
        and attention_mask.ndim == 4
        and 0 < attention_mask.shape[-2] < query_len
        and attention_mask.shape[-1] == query_len
    )


CHUNK_ROWS = 128
"""Noisy query rows per chunk (:func:`noisy_chunks`), grown to a block edge by the plan. Fewer rows a chunk read fewer
keys (the prefix grows with the chunk's last block) at one more kernel call each, and on the CPU a call's fixed cost
is large: one layer's attention, forward and backward, at SmolLM2's shape took 297 ms with one call for all noisy
rows, 288 / 271 / 251 ms in chunks of 32 / 64 / 128 rows and 460 ms in chunks of 16 (N = 656 noisy rows, 1,680
columns); at the recipe's rows (N ≈ 100) every choice from 32 up is within the noise (docs/benchmarks.md)."""


@dataclass(frozen=True)
class NoisyChunk:
    """Noisy query rows ``[q0, q1)`` and the key columns any of them may attend: noisy ``[a, b)`` (their own blocks)
    and the first ``clean`` clean columns (the prefix), with the mask restricted to those keys."""

    q0: int
    q1: int
    a: int
    b: int
    clean: int
    mask: torch.Tensor  # (B, 1, q1 - q0, (b - a) + clean)


def noisy_chunks(attention_mask: torch.Tensor, chunk_rows: int | None = None) -> list[NoisyChunk]:
    """The chunks of a noisy-rows mask ``(B, 1, N, N + L)`` (0 where a query may attend, a large negative number
    elsewhere): rows in runs of about ``chunk_rows``, each cut where no row of the run reads a noisy key of the next
    one (a block boundary), each with the smallest noisy range and clean prefix that hold every key its rows may
    attend. Memoised on the mask tensor: one plan for every layer that reads it. ``chunk_rows``: :data:`CHUNK_ROWS`
    where None."""
    chunk_rows = CHUNK_ROWS if chunk_rows is None else int(chunk_rows)
    plan = getattr(attention_mask, "_prove_noisy_chunks", None)
    if plan is not None and plan[0] == chunk_rows:
        return plan[1]
    n, t = attention_mask.shape[-2], attention_mask.shape[-1]
    masked = torch.finfo(attention_mask.dtype).min / 2
    allowed = (attention_mask[:, 0] > masked).any(dim=0)  # (N, T): a key any example's row may read
    noisy = allowed[:, :n]  # (N, N)
    cols = torch.arange(n, device=allowed.device)
    first = torch.where(noisy, cols, n).min(dim=1).values.tolist()  # the first noisy key each row reads
    last_noisy = torch.where(noisy, cols, -1).max(dim=1).values  # (N,)
    clean_cols = torch.arange(t - n, device=allowed.device)
    last_clean = torch.where(allowed[:, n:], clean_cols, -1).max(dim=1).values  # (N,) -1: no clean key
    # a row may end a chunk when no later row reads a noisy key at or before it
    later_first = [n] * (n + 1)
    for r in range(n - 1, -1, -1):
        later_first[r] = min(first[r], later_first[r + 1])
    chunks, q0 = [], 0
    while q0 < n:
        q1 = min(q0 + max(1, chunk_rows), n)
        while q1 < n and later_first[q1] < q1:  # a later row reads a key of this chunk: grow to its edge
            q1 += 1
        a = min(first[q0:q1])
        b = int(last_noisy[q0:q1].max()) + 1
        clean = int(last_clean[q0:q1].max()) + 1
        cut = torch.cat(
            [attention_mask[:, :, q0:q1, a:b], attention_mask[:, :, q0:q1, n : n + clean]], dim=-1
        ).contiguous()
        chunks.append(NoisyChunk(q0, q1, a, b, clean, cut))
        q0 = q1
    attention_mask._prove_noisy_chunks = (chunk_rows, chunks)  # type: ignore[attr-defined]  # memo on the mask
    return chunks


def mars_block_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``(B, H, T, d)``, ``key``/``value`` ``(B, H_kv, T, d)``;
    returns ``((B, T, H, d), None)``. With a noisy-rows mask ``(B, 1, N, T)`` (:func:`is_noisy_rows_mask`): the
    first N queries chunk by chunk (:func:`noisy_chunks`) against only the keys their rows may read, the last T − N
    the last T − N keys causally; else sdpa."""
    t = query.shape[2]
    if not is_noisy_rows_mask(attention_mask, t):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    assert attention_mask is not None  # a noisy-rows mask
    n = attention_mask.shape[-2]
    kwargs.pop("is_causal", None)
    clean, _ = sdpa_attention_forward(
        module,
        query[:, :, n:],
        key[:, :, n:],
        value[:, :, n:],
        None,
        dropout,
        scaling,
        is_causal=True,
        **kwargs,
    )  # (B, L, H, d): the clean stream reads only itself, causally
    parts = []
    for c in noisy_chunks(attention_mask):
        k_c = torch.cat([key[:, :, c.a : c.b], key[:, :, n : n + c.clean]], dim=2)
        v_c = torch.cat([value[:, :, c.a : c.b], value[:, :, n : n + c.clean]], dim=2)
        out, _ = sdpa_attention_forward(
            module, query[:, :, c.q0 : c.q1], k_c, v_c, c.mask, dropout, scaling, is_causal=False, **kwargs
        )  # (B, q1 - q0, H, d): own blocks + the clean prefix before them
        parts.append(out)
    return torch.cat([*parts, clean], dim=1), None  # (B, T, H, d)


AttentionInterface.register(BLOCK_ATTENTION, mars_block_attention)
AttentionMaskInterface.register(BLOCK_ATTENTION, sdpa_mask)  # every other call builds sdpa's masks


def use_block_attention(model: Any) -> None:
    """Switch ``model`` (a ``PreTrainedModel``, or a PEFT model around one) to :data:`BLOCK_ATTENTION`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(BLOCK_ATTENTION)


def mars_attention_impl(choice: str, model_impl: str | None) -> str | None:
    """The attention a MARS step runs for ``stage.attention`` = ``choice`` (``auto``, ``blocks``, ``mask``) on a model
    whose attention is ``model_impl``: :data:`BLOCK_ATTENTION`, or the model's own (which then takes one mask over the
    whole input: :func:`prove.train.masks.trimmed_attention_mask`)."""
    choice = str(choice)
    if choice not in ("auto", "blocks", "mask"):
        raise ValueError(f"stage.attention={choice}: use auto, blocks or mask")
    if choice == "blocks" or (choice == "auto" and model_impl in ("sdpa", BLOCK_ATTENTION)):
        return BLOCK_ATTENTION
    if model_impl == BLOCK_ATTENTION:  # mask on a model switched earlier: sdpa with the whole mask
        return "sdpa"
    return model_impl
