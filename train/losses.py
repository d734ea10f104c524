"""MARS block-training loss (DESIGN §2.1). Pure function; imports only torch.

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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from prove.train.masks import IGNORE_INDEX


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
    """MARS loss from the 2L logits.

    ``logits``: ``(B, 2L, V)`` for the input ``[noisy | clean]``; ``labels``: ``(B, L)``, -100 on the
    prompt and on padding. Sequences without any target contribute 0 (and are not counted).
    """
    bsz, two_l, vocab = logits.shape
    length = labels.shape[1]
    assert two_l == 2 * length, f"logits cover {two_l} positions, expected 2 × {length}"
    noisy_t = clean_t = shifted_block_targets(labels)  # (B, L): both streams predict the same next labels
    targets = torch.cat([noisy_t, clean_t], dim=1)  # (B, 2L)
    ce = F.cross_entropy(
        logits.reshape(-1, vocab).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(bsz, two_l)  # (B, 2L)
    valid = targets != IGNORE_INDEX  # (B, 2L)

    def per_seq(sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        count = valid[:, sl].sum(dim=1)  # (B,)
        return ce[:, sl].sum(dim=1) / count.clamp(min=1), count > 0

    noisy, has_noisy = per_seq(slice(0, length))
    clean, has_clean = per_seq(slice(length, two_l))
    per_sequence = noisy + ar_weight * clean  # (B,)
    n_seq = (has_noisy | has_clean).sum().clamp(min=1)
    return MarsLoss(
        loss=per_sequence.sum() / n_seq,
        noisy=noisy.detach().sum() / n_seq,
        clean=clean.detach().sum() / n_seq,
    )
