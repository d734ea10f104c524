"""The block methods' rules on hand-made numbers: never / always / partly accepted, exact tokens."""

from __future__ import annotations

import torch
from prove.decode.rules import Accept
from prove.decode.rules.block import greedy_match, greedy_match_branch, mars_rule, prove_rule


def logits_for(greedy: list[int], vocab: int = 8) -> torch.Tensor:
    """(len(greedy), V) logits whose argmax per row is ``greedy``."""
    z = torch.zeros(len(greedy), vocab)
    z[torch.arange(len(greedy)), torch.tensor(greedy)] = 5.0
    return z


def test_mars_commits_y1_then_the_confident_run():
    conf = torch.tensor([0.1, 0.99, 0.96, 0.5, 0.99])
    assert mars_rule(conf, tau=0.95) == Accept(3)  # y_1 regardless of its own confidence, then 0.99, 0.96
    assert mars_rule(conf, tau=0.0) == Accept(5)  # always
    assert mars_rule(conf, tau=1.01) == Accept(1)  # never beyond y_1: AR
    assert mars_rule(torch.tensor([0.3]), tau=0.95) == Accept(1)
    assert mars_rule(torch.tensor([]), tau=0.95) == Accept(0)
    # p̃ = τ passes (≥, not >), as in the MARS paper; 0.5 and 0.25 are exact in binary floating point
    assert mars_rule(torch.tensor([0.1, 0.5, 0.5, 0.25]), tau=0.5) == Accept(3)


def test_prove_rule_threshold_on_the_product():
    conf = torch.tensor([0.9, 0.8, 0.5, 0.9])
    q = torch.tensor([0.5, 0.5, 0.1, 1.0])  # products 0.45, 0.40, 0.05, 0.9
    assert prove_rule(conf, q, theta=0.3) == Accept(2)  # the run stops at 0.05 even though 0.9 follows
    assert prove_rule(conf, q, theta=0.0) == Accept(4)  # θ = 0: whole block
    assert prove_rule(conf, q, theta=1.5) == Accept(1)  # θ > 1: y_1 only
    assert prove_rule(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), theta=0.25) == Accept(2)  # ≥, not >
    # y_1 failing the test is still committed, and nothing after it.
    assert prove_rule(torch.tensor([0.1, 1.0]), torch.tensor([0.1, 1.0]), theta=0.5) == Accept(1)
    assert prove_rule(torch.tensor([]), torch.tensor([]), theta=0.1) == Accept(0)


def test_greedy_match_never_always_partly():
    target = logits_for([3, 1, 4, 1, 5])  # greedy tokens at positions 1..4 and the bonus 5
    assert greedy_match(torch.tensor([0, 1, 4, 1]), target) == Accept(0, 3)  # never: correction = 3
    assert greedy_match(torch.tensor([3, 1, 4, 1]), target) == Accept(4, 5)  # always: bonus = 5
    assert greedy_match(torch.tensor([3, 1, 7, 1]), target) == Accept(2, 4)  # partly: correction = 4
    assert greedy_match(torch.tensor([3, 1, 7, 1]), target).committed == 3


def test_greedy_match_branch_takes_the_second_candidate_only_where_the_block_fails_to_it():
    y = torch.tensor([3, 1, 7, 1])
    main = logits_for([3, 1, 4, 1, 5])  # y fails at position 2 (0-based); the greedy token there is 4
    branch = logits_for([1, 6])  # rows after [z=4, y_4=1]: the greedy tokens 1 (y_4 matches), then 6
    assert greedy_match_branch(y, main, 2, 4, branch) == Accept(4, 6, path=(3, 1, 4, 1))
    assert greedy_match_branch(y, main, 2, 4, logits_for([5, 6])) == Accept(3, 5, path=(3, 1, 4))  # y_4 fails
    assert greedy_match_branch(y, main, 2, 6, branch) == Accept(2, 4)  # z is not the greedy token
    assert greedy_match_branch(y, main, 1, 5, logits_for([0, 0, 0])) == Accept(2, 4)  # y fails elsewhere
    assert greedy_match_branch(y, main, 3, 2, logits_for([6])) == Accept(2, 4)
    last = greedy_match_branch(torch.tensor([3, 1, 4, 2]), main, 3, 1, logits_for([6]))
    assert last == Accept(4, 6, path=(3, 1, 4, 1))  # a branch at the last position: its bonus row


def test_greedy_match_with_nothing_proposed_is_ar():
    assert greedy_match(torch.tensor([], dtype=torch.long), logits_for([6])) == Accept(0, 6)
