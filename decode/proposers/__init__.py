"""Proposers (docs/design.md §3): each returns a ``Proposal`` of k candidate tokens per cycle.

``PROPOSERS`` maps a method's proposer name to a factory ``(models, params, generator) -> Proposer``;
a new proposer (draft model, n-gram, ...) is a new class plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prove.decode.proposers.base import Proposal, Proposer

ProposerFactory = Callable[[Any, Any, Any], Proposer]


def _none(models, params, generator) -> Proposer:
    from prove.decode.proposers.block import NoProposer

    return NoProposer(models.target.device)


def _block(models, params, generator) -> Proposer:
    from prove.decode.proposers.block import BlockProposer

    assert models.mask_token_id is not None, (
        "the Decoder checks the mask token before building a block proposer"
    )
    return BlockProposer(
        models.target,
        models.mask_token_id,
        params.block_size,
        threshold=params.draft_threshold or 0.0,
        allowed=models.allowed,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        generator=generator,
    )


def _draft(models, params, generator) -> Proposer:
    from prove.decode.proposers.draft import DraftProposer

    assert models.draft is not None, "the Decoder checks that a draft model is given"
    return DraftProposer(
        models.draft,
        params.k,
        vocab_size=models.target.vocab_size,
        threshold=params.draft_threshold or 0.0,
        allowed=models.allowed,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        generator=generator,
    )


def _draft_block(models, params, generator) -> Proposer:
    from prove.decode.proposers.pard import PardProposer

    assert models.draft is not None and models.mask_token_id is not None, (
        "the Decoder checks the draft and its mask token before building pard's proposer"
    )
    return PardProposer(
        models.draft,
        models.mask_token_id,
        params.block_size,
        vocab_size=models.target.vocab_size,
        allowed=models.allowed,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        generator=generator,
    )


PROPOSERS: dict[str, ProposerFactory] = {
    "none": _none,
    "block": _block,
    "draft": _draft,
    "draft-block": _draft_block,
}

__all__ = ["PROPOSERS", "Proposal", "Proposer", "ProposerFactory"]
