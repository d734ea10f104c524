"""The method registry (DESIGN §3): a method = (proposer, verifier, rule adapter, default params).

Composing differently is one new entry, not a new code path: e.g. NSD's nucleus rule on the block
proposer self-verified is ``Method("block-nsd", proposer="block", verifier="self", accept=...)``.
``accept`` receives a ``CycleView`` (proposal, target / verifier logits, params, generator, per-request
state) and calls a pure rule from ``prove.decode.rules``.

| method           | proposer | verifier | rule                                                    |
|------------------|----------|----------|---------------------------------------------------------|
| `ar`             | none     | self     | the target's next token (greedy, or sampled)            |
| `mars`           | block    | none     | y_1, then y_i while p̃_i ≥ τ (τ = 0.95, MARS)            |
| `prove`          | block    | small    | longest leading run with p̃_i·q_i ≥ θ, y_1 always (θ = 0.1) |
| `prove-lossless` | block    | self     | greedy match + correction / bonus (exactly AR greedy)   |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from prove.decode.engine import CycleView
from prove.decode.proposers import ProposerFactory
from prove.decode.rules.base import Accept
from prove.decode.rules.block import greedy_match, mars_rule, prove_rule
from prove.decode.sampling import logits_to_probs, pick


@dataclass(frozen=True)
class Method:
    name: str
    proposer: str | ProposerFactory
    """A key of ``prove.decode.proposers.PROPOSERS`` (or a factory ``(models, params, generator) -> Proposer``)."""
    verifier: str
    """``none``, ``self`` (the target scores the block) or ``small`` (a separate verifier model)."""
    accept: Callable[[CycleView], Accept]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults of the ``DecodeParams`` this method reads (mirrored in conf/method/<name>.yaml)."""
    uses: tuple[str, ...] = ()
    """The ``DecodeParams`` this method reads beyond sampling (theta, tau, block_size, k, ...)."""
    greedy_only: bool = False
    """True if the rule is defined for temperature 0 only (it errors early otherwise)."""
    summary: str = ""

    @property
    def needs_mask(self) -> bool:
        """Block proposers need the checkpoint's ``<|mask|>`` token."""
        return self.proposer == "block"


METHODS: dict[str, Method] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    if method.name in METHODS and not replace:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str | Method) -> Method:
    if isinstance(name, Method):
        return name
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; pick one of: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def token_prob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Softmax probability of each ``tokens[i]`` (k,) under ``logits[i]`` (≥k, V) → (k,)."""
    k = tokens.shape[0]
    return torch.softmax(logits[:k].float(), -1).gather(-1, tokens[:, None])[:, 0]


def _ar(view: CycleView) -> Accept:
    assert view.target_logits is not None
    p = view.params
    if p.temperature == 0:
        return greedy_match(view.proposal.tokens, view.target_logits)
    probs = logits_to_probs(view.target_logits[0], p.temperature, p.top_k, p.top_p)  # (V,)
    return Accept(0, int(pick(probs, p.temperature, view.generator)))


def _mars(view: CycleView) -> Accept:
    return mars_rule(view.proposal.conf, view.params.tau)


def _prove(view: CycleView) -> Accept:
    assert view.verifier_logits is not None
    q = token_prob(view.verifier_logits, view.proposal.tokens)  # (k,)
    return prove_rule(view.proposal.conf, q, view.params.theta)


def _prove_lossless(view: CycleView) -> Accept:
    assert view.target_logits is not None
    return greedy_match(view.proposal.tokens, view.target_logits)


register_method(Method("ar", "none", "self", _ar, summary="one token per pass: the baseline, through the same engine"))
register_method(
    Method("mars", "block", "none", _mars, {"tau": 0.95}, ("tau", "block_size"), summary="MARS confidence rule")
)
register_method(
    Method("prove", "block", "small", _prove, {"theta": 0.1}, ("theta", "block_size"), summary="ProVe: p̃·q ≥ θ")
)
register_method(
    Method(
        "prove-lossless",
        "block",
        "self",
        _prove_lossless,
        {},
        ("block_size",),
        greedy_only=True,
        summary="block proposals verified by the model itself: exactly its greedy output",
    )
)
