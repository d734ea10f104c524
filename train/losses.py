"""The stages' losses: MARS block training (docs/design.md §2.1) and stage distill's CE + top-k KL
(:func:`distill_loss`). Pure functions of tensors.

MARS:

The model reads ``[noisy | clean]`` (2L tokens, see :mod:`prove.train.masks`) and its logits are
shifted over the whole 2L sequence: the output at j predicts input j + 1. Inside each stream that is
ordinary next-token prediction of the clean example; the one pair that crosses streams (the last
noisy output predicting the first clean token) is not a target.

- noisy term: CE at noisy outputs whose target is a response token — the output at a placeholder (or
  at the last prompt token) predicts the next token from the clean context before its block and the
  placeholders up to itself (MARS's block prediction);
- clean term: ordinary causal-LM CE on the clean stream's response tokens (the AR term; without it
  quality collapses at K = 16);
- ``loss = mean over sequences of [ noisy_sum / noisy_count + ar_weight · clean_sum / clean_count ]``:
  each sequence is normalized by its own number of targets, then sequences are averaged, so long and
  short responses weigh the same (per-sequence normalization).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from prove.data.chat import IGNORE_INDEX


@dataclass(frozen=True)
class MarsLoss:
    """The loss and its two terms (batch means of the per-sequence means), for logging."""

    loss: torch.Tensor
    noisy: torch.Tensor
    clean: torch.Tensor


def shifted_block_targets(labels: torch.Tensor) -> torch.Tensor:
    """Targets of both the noisy and the clean outputs ``(B, L)``: ``labels`` shifted left by one.

    The output at stream index j predicts the label at j + 1; the last index of each stream has no
    target within its stream (-100).
    """
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)  # (B, L)


def mars_loss(logits: torch.Tensor, labels: torch.Tensor, ar_weight: float = 1.0) -> MarsLoss:
    """MARS loss from the full 2L logits (the reference layout; training computes the head only at targets,
    :func:`mars_loss_terms` over :func:`head_cross_entropy`).

    ``logits``: ``(B, 2L, V)`` for the input ``[noisy | clean]``; ``labels``: ``(B, L)``, -100 on the prompt and on
    padding. Sequences without any target contribute 0 (and are not counted).
    """
    bsz, two_l, vocab = logits.shape
    length = labels.shape[1]
    assert two_l == 2 * length, f"logits cover {two_l} positions, expected 2 × {length}"
    noisy_t = clean_t = shifted_block_targets(labels)  # (B, L): both streams predict the same next labels
    targets = torch.cat([noisy_t, clean_t], dim=1)  # (B, 2L)
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)  # (n,) each
    ce = F.cross_entropy(logits[rows, cols].float(), targets[rows, cols], reduction="none")  # (n,)
    return mars_loss_terms(ce, rows, cols < length, bsz, ar_weight)


def mars_loss_terms(
    ce: torch.Tensor,
    rows: torch.Tensor,
    noisy: torch.Tensor,
    batch_size: int,
    ar_weight: float = 1.0,
    noisy_weight: torch.Tensor | None = None,
) -> MarsLoss:
    """The MARS loss from the CE of every target, however the targets were laid out.

    ``ce``, ``rows`` (the example of each target), ``noisy`` (True for a noisy-stream target): ``(n,)``.
    ``loss = mean over sequences with a target of [noisy_sum / noisy_count + ar_weight · clean_sum / clean_count]``.
    ``noisy_weight`` ``(n,)`` (read at noisy targets only; :func:`depth_weights`): the noisy term becomes each
    sequence's weighted mean ``Σ w·ce / Σ w``; ``None`` is weight 1 everywhere (MARS's loss).
    """
    w = noisy.to(ce.dtype) if noisy_weight is None else torch.where(noisy, noisy_weight.to(ce.dtype), 0.0)
    zeros = torch.zeros(batch_size, dtype=ce.dtype, device=ce.device)
    sums = torch.stack([zeros.index_add(0, rows, ce * w), zeros.index_add(0, rows, ce * ~noisy)])  # (2, B)
    counts = torch.stack(
        [zeros.index_add(0, rows, w), zeros.index_add(0, rows, (~noisy).to(ce.dtype))]
    )  # (2, B)
    means = sums / counts.clamp(min=1)  # (2, B): noisy, clean per sequence
    per_sequence = means[0] + ar_weight * means[1]  # (B,)
    n_seq = (counts.sum(dim=0) > 0).sum().clamp(min=1)
    return MarsLoss(
        loss=per_sequence.sum() / n_seq,
        noisy=means[0].detach().sum() / n_seq,
        clean=means[1].detach().sum() / n_seq,
    )


def depth_weights(depth: torch.Tensor, decay: float) -> torch.Tensor:
    """Weights ``decay ** (d − 2)`` of noisy targets at decode depth ``d`` (:func:`prove.train.masks.noisy_depth`),
    depth 1 weighing as depth 2: with ``decay`` < 1 the shallow depths, which decide tokens per cycle, dominate the
    noisy gradient instead of the deep ones (nearly unlearnable at K = 8 and above); 1 is MARS's uniform loss."""
    return torch.full_like(depth, decay, dtype=torch.float32) ** (depth - 2).clamp(min=0)


def _head_ce(
    head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="none")


def head_cross_entropy(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Per-target CE ``(n,)`` of ``head(hidden)`` (hidden ``(n, H)``, the final hidden states at the targets only).

    ``head`` is the model's output-embedding *module* (under ZeRO-3 its hooks gather the sharded weight; the weight
    itself is never read here). With ``chunk_rows`` set and more rows than that, the logits are made ``chunk_rows``
    at a time and recomputed in the backward pass (activation checkpointing), so at most one chunk's fp32 logits
    exist at once; the result equals the unchunked one."""
    n = hidden.shape[0]
    if chunk_rows is None or n <= chunk_rows:
        return _head_ce(head, hidden, targets)
    from torch.utils.checkpoint import checkpoint

    parts = [
        checkpoint(
            _head_ce, head, hidden[i : i + chunk_rows], targets[i : i + chunk_rows], use_reentrant=False
        )
        for i in range(0, n, chunk_rows)
    ]
    return torch.cat(parts)


@dataclass(frozen=True)
class DistillLoss:
    """The loss and its two terms (token means over the batch's response tokens), for logging."""

    loss: torch.Tensor
    ce: torch.Tensor
    kl: torch.Tensor


def distill_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    topk_logprobs: torch.Tensor | None = None,
    kl_weight: float = 0.0,
) -> DistillLoss:
    """CE on the response tokens + ``kl_weight`` × the token-level top-k KL to the proposer.

    Shapes: ``logits`` ``(B, L, V)`` (the verifier's, output t predicts input t + 1); ``labels`` ``(B, L)``,
    -100 on the prompt and padding; ``topk_ids`` / ``topk_logprobs`` ``(B, L, k)``: at each label position t,
    the proposer's k most likely tokens for position t and their log-probabilities log p (as the proposer's
    full softmax gave them).

    With p̂ the proposer's distribution truncated to its top-k and renormalised,
    p̂_i = exp(log p_i) / Σ_{j∈top-k} exp(log p_j), and q the verifier's full softmax over the vocabulary,
    the KL term at a response position is

        KL(p̂ ‖ q) = Σ_{i ∈ top-k} p̂_i · (log p̂_i − log q_i),

    a proper KL between two distributions over the whole vocabulary (p̂ is 0 outside the top-k): ≥ 0, and 0
    only when q equals p̂. It is not q renormalised over the top-k, so it also moves the verifier's mass from
    outside the proposer's top-k into it, which is what raises q on the tokens the proposer proposes.

    Both terms are means over the micro-batch's response tokens; the Trainer then averages micro-batches
    (unlike SFT's loss, which divides by the response tokens of the whole accumulated, all-rank batch, a
    micro-batch with few response tokens weighs as much as one with many).
    """
    bsz, length, vocab = logits.shape
    z = logits[:, :-1].float()  # (B, L-1, V): output t predicts label t+1
    targets = labels[:, 1:]  # (B, L-1)
    valid = targets != IGNORE_INDEX  # (B, L-1)
    count = valid.sum().clamp(min=1)
    ce = (
        F.cross_entropy(z.reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        / count
    )
    kl = torch.zeros((), dtype=ce.dtype, device=ce.device)
    if kl_weight > 0:
        if topk_ids is None or topk_logprobs is None:
            raise ValueError("kl_weight > 0 needs the proposer's top-k ids and log-probs (distill.top_k ≥ 1)")
        ids = topk_ids[:, 1:].long()  # (B, L-1, k)
        log_p_hat = torch.log_softmax(
            topk_logprobs[:, 1:].float(), dim=-1
        )  # (B, L-1, k): renormalised over the k
        log_q = z.gather(-1, ids) - torch.logsumexp(
            z, dim=-1, keepdim=True
        )  # (B, L-1, k): verifier's full softmax
        per_token = (log_p_hat.exp() * (log_p_hat - log_q)).sum(-1)  # (B, L-1)
        kl = (per_token * valid).sum() / count
    return DistillLoss(loss=ce + kl_weight * kl, ce=ce.detach(), kl=kl.detach())
