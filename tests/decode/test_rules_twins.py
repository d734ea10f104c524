"""The sync-free rule twins (``prove.decode.rules.twins``) equal the pure rules on hand-made logits, ties and
EOS included."""

from __future__ import annotations

import itertools

import pytest
import torch
from prove.decode.engine import Stopper
from prove.decode.rules.block import greedy_match, mars_rule, prove_rule
from prove.decode.rules.speculative import sd_sample
from prove.decode.rules.twins import (
    asd_greedy_twin,
    commit_record,
    greedy_match_twin,
    mars_rule_twin,
    prove_rule_twin,
    sd_sample_twin,
)

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


@pytest.mark.parametrize("k", [0, 1, 3])
def test_sampled_sd_twin_equals_sd_sample_under_the_same_uniforms(k):
    """Fails if the twin reads its uniforms in another order than the rule (accept tests u_1..u_k, then the draw
    u_{k+1}), tests acceptance otherwise (u·q < p), or draws the correction from another row or residual.
    Draft and target share some zero-mass tokens and the uniforms include 0 and values near 1 (the inverse CDF's
    edges); k = 0 is the sampled AR step (the bonus from p_1)."""
    g = torch.Generator().manual_seed(k)
    V = 6
    target = torch.randn(k + 1, V, generator=g).softmax(-1)
    draft = torch.randn(k, V, generator=g).softmax(-1)
    target[:, 0], draft[:, 0] = 0.0, 0.0
    target = target / target.sum(-1, keepdim=True)
    draft = draft / draft.sum(-1, keepdim=True)
    seen = set()
    for trial in range(200):
        tokens = torch.multinomial(draft, 1, generator=g)[:, 0] if k else torch.zeros(0, dtype=torch.long)
        u = torch.rand(k + 1, generator=g)
        if trial < 2:
            u.fill_(0.0 if trial == 0 else 1.0 - 1e-7)
        ref = sd_sample(tokens, draft, target, uniforms=u)
        n, extra = sd_sample_twin(tokens, draft, target, u)
        assert (n.dim(), extra.dim()) == (0, 0)
        assert (int(n), int(extra)) == (ref.n, ref.extra)
        seen.add(ref.n)
    assert len(seen) == k + 1, f"some accepted counts never occurred: {sorted(seen)}"


def test_asd_twin_equals_asd_greedy_on_a_grid():
    """Fails if the twin forgets the spent regret it is handed, caps mismatches per block off by one, gates with
    another K or i (K − i + 1, 1-based; K may exceed k), lets a greedy token's zero regret count as a mismatch, sums
    the budget in another order, or scans past the first refusal. Logits on a coarse grid give ties (a tied
    non-first argmax is a mismatch of regret 0) and regrets exactly at the gate and the budget."""
    from prove.decode.rules.speculative import AsdState, asd_greedy

    g = torch.Generator().manual_seed(0)
    seen = set()
    for trial in range(400):
        k = 1 + trial % 4
        logits = torch.randint(0, 5, (k + 1, 5), generator=g).float() * 0.25
        tokens = torch.randint(0, 5, (k,), generator=g)
        spent = float(torch.randint(0, 9, (), generator=g)) * 0.25
        kw = {
            "budget": [0.0, 0.5, 2.0][trial % 3],
            "gate": [0.25, 0.5][trial % 2],
            "max_mismatches": trial % 3,
        }
        K = k + trial % 2
        ref, state = asd_greedy(tokens, logits, AsdState(spent), block_size=K, **kw)
        n, extra, spent_after = asd_greedy_twin(
            tokens, logits, torch.tensor(spent, dtype=torch.float64), block_size=torch.tensor(K), **kw
        )
        assert (int(n), int(extra), float(spent_after)) == (ref.n, ref.extra, state.spent), (trial, kw)
        seen.add((ref.n > 0, state.spent > spent))
    assert seen == {(False, False), (True, False), (True, True)}, "some kind of verdict never occurred"
