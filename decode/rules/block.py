"""Acceptance rules of the block methods (docs/design.md §3): pure functions of one proposed block.

Notation, kept explicit because speculative-decoding papers swap p and q:

- ``proposer_conf`` (k,): p̃_i, the proposer's probability of the token y_i it proposed.
- ``verifier_probs`` (k,): q_i, a verifier's probability of y_i, teacher-forced on y_<i.
- ``target_logits`` (k+1, V): the model being accelerated, teacher-forced over y_1..y_k; row i scores
  position i+1, row k is the bonus position after y_k.
"""

from __future__ import annotations

import torch
from prove.decode.rules.base import Accept


def leading_true(ok: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True along the last dim: (..., k) bool → (...) long (0 for k = 0)."""
    return ok.long().cumprod(-1).sum(-1)


def _leading_run(ok: torch.Tensor) -> int:
    return int(leading_true(ok))


def _matching_prefix(tokens: list[int], greedy: list[int]) -> int:
    """How many leading ``tokens`` equal ``greedy`` at the same index (``greedy`` has at least as many)."""
    n = 0
    while n < len(tokens) and tokens[n] == greedy[n]:
        n += 1
    return n


def mars_rule(proposer_conf: torch.Tensor, tau: float) -> Accept:
    """MARS confidence rule (Jin et al., arXiv 2604.07023): commit y_1, then y_i while p̃_i ≥ τ.

    y_1 is the model's ordinary next-token prediction, so it is always committed; τ > 1 is AR.
    """
    k = proposer_conf.shape[0]
    if k == 0:
        return Accept(0)
    return Accept(1 + _leading_run(proposer_conf[1:] >= tau))


def prove_rule(proposer_conf: torch.Tensor, verifier_probs: torch.Tensor, theta: float) -> Accept:
    """ProVe rule: the longest leading run with p̃_i · q_i ≥ θ, and y_1 always.

    y_1 is the block proposer's exact next-token prediction, committed even if it fails the test.
    θ = 0 commits whole blocks; θ > 1 commits y_1 only (AR).
    """
    k = proposer_conf.shape[0]
    if k == 0:
        return Accept(0)
    score = proposer_conf * verifier_probs  # (k,)
    return Accept(max(1, _leading_run(score >= theta)))


def greedy_match(tokens: torch.Tensor, target_logits: torch.Tensor) -> Accept:
    """Greedy verification: the prefix of y equal to the target's greedy tokens, then the greedy
    correction (at the first mismatch) or bonus (after y_k) token.

    Exactly greedy decoding of the target, whatever the proposer (ProVe-lossless, greedy SD, AR with
    k = 0). ``tokens`` (k,), ``target_logits`` (k+1, V).
    """
    k = tokens.shape[0]
    assert target_logits.shape[0] == k + 1, "target_logits needs a row per proposed token plus the bonus row"
    greedy = target_logits.argmax(-1).tolist()  # k+1 ids (lists: a handful of ids, every cycle)
    n = _matching_prefix(tokens.tolist(), greedy)
    return Accept(n, greedy[n])


def greedy_match_branch(
    tokens: torch.Tensor, target_logits: torch.Tensor, b: int, z: int, branch_logits: torch.Tensor
) -> Accept:
    """Greedy verification of a block with a second candidate ``z`` at position ``b`` (0-based): the block
    y (``tokens`` (k,), ``target_logits`` (k+1, V)) as in :func:`greedy_match`, and the branch
    B = [z, y_{b+2}, ..., y_k], teacher-forced after y_1..y_b (``branch_logits`` (k−b, V): row r scores the
    token after B[r]).

    The branch counts only when y's leading run stops at b with the greedy correction equal to z: then
    z and the leading run of B[1:] that matches the target's greedy tokens are committed, and the
    correction or bonus comes from the branch rows. Still exactly greedy decoding of the target: every
    committed token is the target's argmax given the committed tokens before it.
    """
    k = tokens.shape[0]
    assert 0 <= b < k and branch_logits.shape[0] == k - b, "one branch row per token of [z, y_{b+2}..y_k]"
    main = greedy_match(tokens, target_logits)
    if main.n != b or main.extra != z:
        return main
    ys = tokens.tolist()
    rest = ys[b + 1 :]  # B[1:]
    greedy = branch_logits.argmax(-1).tolist()  # k−b ids
    m = _matching_prefix(rest, greedy)
    path = (*ys[:b], z, *rest[:m])
    return Accept(b + 1 + m, greedy[m], path=path)
