"""What a proposer returns and the interface every proposer implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Proposal:
    """A block of candidate tokens y_1..y_k (k may be 0: AR proposes nothing).

    ``conf`` is p̃_i, the proposer's probability of the token it proposed; ``probs`` the proposer's
    distribution at each position (``prove.decode.sampling.logits_to_probs``: the tempered, filtered
    distribution y_i was drawn from when sampling, the plain softmax when greedy), which the
    speculative-sampling rules compare with the target's.
    """

    tokens: torch.Tensor  # (k,) long
    conf: torch.Tensor  # (k,) float
    probs: torch.Tensor | None = None  # (k, V) float
    branch: tuple[int, int] | None = None
    """(b, z): a second candidate z for position b (0-based), verified in the same pass as the block
    [y_1..y_b, z, y_{b+2}..y_k] (a block proposal's later tokens do not depend on the earlier ones, so the
    same tokens follow z). Only the fused prove-lossless cycle proposes one (``prove.decode.engine.fused``)."""

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> Proposal:
        return cls(
            tokens=torch.zeros(0, dtype=torch.long, device=device),
            conf=torch.zeros(0, device=device),
            probs=None,
        )


class Proposer(Protocol):
    """Proposes a block given the committed sequence (prompt + new tokens so far).

    A proposer owns no cache bookkeeping beyond calling its ``ModelRunner``'s ``forward``: the engine
    syncs every runner to the committed sequence after each cycle. ``budget`` is how many tokens the
    proposal may hold (the request's remaining tokens, less the correction / bonus token when the target
    verifies): ≥ 1 when no target verifies, possibly 0 otherwise, when an empty proposal makes the cycle
    an AR step. Proposing more is wasted work, never wrong.
    """

    def propose(self, seq: Sequence[int], budget: int) -> Proposal: ...
