"""Sync-free twins of the pure rules (``prove.decode.rules.block``) for the fast path's device cycle
(``prove.decode.fast``; docs/design.md §3, "The fast path").

Each twin computes what its rule decides with tensors only: counts are 0-d long tensors, never Python ints, so
nothing reads a value back to the host (no ``.item()``, ``.tolist()``, ``nonzero``) and the shapes depend only on
the block size. The cycle can then run as one captured CUDA graph, and its one small record per cycle is the
only copy to the host. ``tests/decode/test_rules_twins.py`` checks each twin equal to its rule.
"""

from __future__ import annotations

import torch
from prove.decode.rules.block import leading_true


def greedy_match_twin(tokens: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rules.block.greedy_match`` from the target's greedy tokens ``greedy`` (k+1,) (its logits' argmax) over
    the proposal ``tokens`` (k,): (n, extra) as 0-d long tensors — the matching prefix and the correction / bonus
    token g_{n+1}."""
    k = tokens.shape[0]
    n = leading_true(tokens == greedy[:k])  # () long
    return n, greedy.gather(0, n.view(1)).view(())


def prove_rule_twin(proposer_conf: torch.Tensor, verifier_probs: torch.Tensor, theta: float) -> torch.Tensor:
    """``rules.block.prove_rule``'s n (k ≥ 1): the leading run of p̃_i·q_i ≥ θ, at least 1 (y_1 always)."""
    return leading_true(proposer_conf * verifier_probs >= theta).clamp(min=1)


def mars_rule_twin(proposer_conf: torch.Tensor, tau: float) -> torch.Tensor:
    """``rules.block.mars_rule``'s n (k ≥ 1): y_1, then the leading run of p̃_i ≥ τ from y_2 on."""
    return 1 + leading_true(proposer_conf[1:] >= tau)


def commit_record(tokens: torch.Tensor, n: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """The cycle's record (k + 2,) long: [committed count n + 1, y_1..y_n, extra, then stale ids]: what the host
    reads once per cycle. ``tokens`` (k,), ``n`` and ``extra`` 0-d."""
    row = torch.cat([tokens, tokens.new_zeros(1)])  # (k+1,)
    row = row.scatter(0, n.view(1), extra.view(1))
    return torch.cat([(n + 1).view(1), row])
