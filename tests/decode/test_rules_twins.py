"""The sync-free rule twins (``prove.decode.rules.twins``) equal the pure rules on hand-made logits, ties and
EOS included."""

from __future__ import annotations

import itertools

import pytest
import torch
from prove.decode.engine import Stopper
from prove.decode.rules.block import greedy_match, mars_rule, prove_rule
from prove.decode.rules.twins import commit_record, greedy_match_twin, mars_rule_twin, prove_rule_twin

EOS = 7


def _logits(greedy: list[int], vocab: int = 8, tie: bool = False) -> torch.Tensor:
    z = torch.zeros(len(greedy), vocab)
    z[torch.arange(len(greedy)), torch.tensor(greedy)] = 5.0
    if tie:  # a tie with a later id: both argmaxes must take the first index
        z[:, vocab - 1] = 5.0
    return z


CASES = [
    ([1, 2, 3], [1, 2, 3, 4]),  # all accepted + bonus
    ([1, 2, 3], [5, 2, 3, 4]),  # none
    ([1, 2, 3], [1, 6, 3, 4]),  # partly
    ([1, EOS, 3], [1, EOS, 3, 4]),  # EOS inside the block: the rule accepts it, the host cuts after it
    ([0, 0], [0, 0, 0]),
]


@pytest.mark.parametrize(("tokens", "greedy"), CASES)
@pytest.mark.parametrize("tie", [False, True])
def test_greedy_twin_and_its_record_equal_greedy_match(tokens, greedy, tie):
    """Fails if the twin counts the prefix differently (e.g. past the first mismatch), picks the wrong extra
    token, breaks an argmax tie otherwise than the rule, or if its record commits other tokens than the rule
    once the host's Stopper has cut it at EOS."""
    logits = _logits(greedy, tie=tie)
    y = torch.tensor(tokens)
    ref = greedy_match(y, logits)
    n, extra = greedy_match_twin(y, logits.argmax(-1))
    assert (int(n), int(extra)) == (ref.n, ref.extra)
    record = commit_record(y, n, extra).tolist()
    count, committed = record[0], record[1 : 1 + record[0]]
    assert committed == tokens[: ref.n] + [ref.extra]
    for limit in (1, 2, 10):  # EOS and max_new_tokens applied on the host exactly as the engine does
        a, b = [], []
        Stopper(limit, [EOS]).commit(a, committed)
        Stopper(limit, [EOS]).commit(b, tokens[: ref.n] + [ref.extra])
        assert a == b
    assert count == ref.committed


def test_confidence_twins_equal_the_rules_on_a_grid():
    """Fails if a twin uses > for ≥, forgets that y_1 is always committed, or runs past the first failing
    position."""
    values = [0.0, 0.25, 0.5, 1.0]
    for conf in itertools.product(values, repeat=3):
        c = torch.tensor(conf)
        for q in ([1.0, 1.0, 1.0], [0.5, 1.0, 0.5]):
            qt = torch.tensor(q)
            for theta in (0.0, 0.25, 0.5, 1.0):
                assert int(prove_rule_twin(c, qt, theta)) == prove_rule(c, qt, theta).n
        for tau in (0.0, 0.25, 0.5, 1.0):
            assert int(mars_rule_twin(c, tau)) == mars_rule(c, tau).n
