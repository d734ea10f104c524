"""The MARS block proposer: the model reads ``[pending, M×K]`` with a plain causal mask in one pass.

The outputs at [last committed token, M_1 … M_{K-1}] are y_1..y_K (docs/design.md §2.1); y_1 is ordinary
next-token prediction. K at decode time may be smaller than the trained block size: under the causal
mask, placeholders after position i do not change the output at i.

``threshold`` (``draft_threshold``): the proposal ends after its first token whose p̃ is below it, so the
verification pass reads only that prefix (the block pass itself still fills K positions: a later p̃ may be high
again, but a leading run past a doubtful token is rarely accepted).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from prove.decode.engine import ModelRunner
from prove.decode.proposers.base import Proposal
from prove.decode.sampling import logits_to_probs, pick, restrict


class BlockProposer:
    def __init__(
        self,
        runner: ModelRunner,
        mask_token_id: int,
        block_size: int,
        *,
        threshold: float = 0.0,
        allowed: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.block_size = block_size
        self.threshold = threshold
        self.allowed = allowed
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator

    def propose(self, seq: Sequence[int], budget: int) -> Proposal:
        k = min(self.block_size, budget)
        if k == 0:
            return Proposal.empty(self.runner.device)
        # Row 0 of the pass over [pending, M_1..M_{k-1}] (at the last committed token) predicts y_1, row i (at M_i)
        # predicts y_{i+1}.
        proposal = self.draw(self.runner.forward(seq, [self.mask_token_id] * (k - 1)))  # (k, V) logits
        return cut_below(proposal, self.threshold)

    def draw(self, logits: torch.Tensor) -> Proposal:
        """The proposal for block logits (k, V): never <|mask|> itself, nor an id the verifier / tokenizer lacks
        (``Models.allowed``); y_i = the argmax (greedy) or a draw from the tempered, filtered distribution."""
        probs = logits_to_probs(restrict(logits, self.allowed), self.temperature, self.top_k, self.top_p)
        if self.temperature == 0:
            # the argmax and its probability in one reduction (ties: the first index, as argmax)
            conf, tokens = probs.max(-1)
            return Proposal(tokens=tokens, conf=conf, probs=probs)
        tokens = pick(probs, self.temperature, self.generator)  # (k,)
        return Proposal(tokens=tokens, conf=probs.gather(-1, tokens[:, None])[:, 0], probs=probs)


def cut_below(proposal: Proposal, threshold: float) -> Proposal:
    """The proposal up to and including its first token with p̃ < ``threshold`` (all of it if none is)."""
    if threshold <= 0:
        return proposal
    low = (proposal.conf < threshold).nonzero()
    if low.numel() == 0:
        return proposal
    n = int(low[0, 0]) + 1
    probs = None if proposal.probs is None else proposal.probs[:n]
    return Proposal(tokens=proposal.tokens[:n], conf=proposal.conf[:n], probs=probs)


class NoProposer:
    """Proposes nothing: the verifier's own next token is the whole cycle (AR)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = device

    def propose(self, seq: Sequence[int], budget: int) -> Proposal:
        return Proposal.empty(self.device)
