"""Verifiers (docs/design.md §3): one teacher-forced pass of a causal LM over the proposed block.

``score(seq, tokens)`` returns logits (k+1, V): row i is the verifier's prediction for position i+1 of
the block given the committed sequence and y_1..y_i; row k is the bonus position after y_k. Methods
name a verifier by role:

- ``self``: the model being accelerated (``model=``) scores its own proposals: its logits are the
  target logits that greedy / speculative rules check against (ProVe-lossless, SD, NSD, ASD, AR).
- ``small``: a separate, smaller model (``verifier=``) whose probabilities q_i ProVe multiplies with p̃_i.
- ``none``: no pass (MARS's confidence rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from prove.decode.engine import ModelRunner, Models
from prove.decode.sampling import restrict


class Verifier(Protocol):
    is_target: bool
    """True if the scores are the target's (the model being accelerated)."""

    def score(self, seq: Sequence[int], tokens: torch.Tensor) -> torch.Tensor | None: ...


class ModelVerifier:
    """``allowed`` (the target's ``Models.allowed``): ids the target's rows may never pick as a correction,
    bonus or AR token (their logits are -inf); a separate verifier's q is its own, unrestricted."""

    def __init__(self, runner: ModelRunner, *, is_target: bool, allowed: torch.Tensor | None = None) -> None:
        self.runner = runner
        self.is_target = is_target
        self.allowed = allowed

    def score(self, seq: Sequence[int], tokens: torch.Tensor) -> torch.Tensor:
        return restrict(self.runner.forward(seq, tokens.tolist()), self.allowed)  # (k+1, V)


class NoVerifier:
    is_target = False

    def score(self, seq: Sequence[int], tokens: torch.Tensor) -> None:
        return None


def build_verifier(role: str, models: Models) -> Verifier:
    if role == "none":
        return NoVerifier()
    if role == "self":
        return ModelVerifier(models.target, is_target=True, allowed=models.allowed)
    if role == "small":
        assert models.verifier is not None, "the Decoder checks that a verifier model is given"
        return ModelVerifier(models.verifier, is_target=False)
    raise ValueError(f"unknown verifier role {role!r}; one of: none, self, small")
