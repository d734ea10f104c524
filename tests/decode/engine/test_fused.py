"""Fused verify-and-draft (``prove.decode.engine.fused``; its tree ``engine.tree``, the pass-cost curve
``engine.pass_cost``): the tree's positions and mask, G_j = a separate block pass from the context ending at y_j,
output identical to transformers' greedy generate (block sizes, J settings, EOS / stop strings / max_new_tokens
inside a block), one model pass per cycle, and the KV-cache invariant after every cycle."""

from __future__ import annotations

import types

import pytest
import torch
from prove.decode import Decoder
from prove.decode.config import DecodeParams
from prove.decode.engine import ModelRunner, tree_attention_bias
from prove.decode.engine.fused import (
    YIELD_WEIGHT,
    FusedBlockProposer,
    acceptance_probs,
    choose_groups,
    choose_groups_by_cost,
    rows_that_pay,
)
from prove.decode.engine.pass_cost import CostCurve, cost_widths, measure_pass_cost, widest_tree
from prove.decode.engine.tree import tree_layout
from prove.decode.methods import get_method

from tests.decode.decode_helpers import hf_generate, mask_ids
from tests.decode.engine.test_engine import _check_cache
from tests.numerics import assert_logits_match

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

N = 40


@pytest.fixture(scope="module")
def refs(lm, prompts, tokenizer):
    """Greedy with <|mask|> suppressed: the random model's argmax is <|mask|> now and then (prompts[0] at
    its 12th token), which no decode may output."""
    return [hf_generate(lm, p, N, suppress=mask_ids(tokenizer)) for p in prompts]


def no_eos(dec: Decoder, prompt, n: int, **kw):
    return dec.generate(prompt, max_new_tokens=n, eos_token_id=[], **kw)


# -- the pure parts -------------------------------------------------------------------------------------------


def test_tree_layout_positions_and_mask():
    lay = tree_layout(3, [(3, 1), (0, 2), (2, 2)])  # groups come out in increasing j
    assert lay.groups == ((0, 3, 2), (2, 5, 2), (3, 7, 1))
    #                     y1 y2 y3 G0 G0 G2 G2 G3
    assert lay.offsets.tolist() == [0, 1, 2, 0, 1, 2, 3, 3]
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0],  # y1
        [1, 1, 0, 0, 0, 0, 0, 0],  # y2: causal among the y's
        [1, 1, 1, 0, 0, 0, 0, 0],  # y3
        [0, 0, 0, 1, 0, 0, 0, 0],  # G0 r=0: context only, and itself
        [0, 0, 0, 1, 1, 0, 0, 0],  # G0 r=1
        [1, 1, 0, 0, 0, 1, 0, 0],  # G2 r=0: y1, y2, itself
        [1, 1, 0, 0, 0, 1, 1, 0],  # G2 r=1
        [1, 1, 1, 0, 0, 0, 0, 1],  # G3: all y's
    ]
    assert lay.attend.int().tolist() == expected
    empty = tree_layout(0, [(0, 3)])  # no proposal: the plain block pass [c, M, M, M]
    assert empty.offsets.tolist() == [0, 1, 2] and empty.attend.int().tolist() == [
        [1, 0, 0],
        [1, 1, 0],
        [1, 1, 1],
    ]
    with pytest.raises(ValueError, match="0 ≤ j ≤ k"):
        tree_layout(2, [(3, 1)])
    with pytest.raises(ValueError, match="repeat"):
        tree_layout(2, [(1, 1), (1, 2)])


def test_tree_layout_with_a_branch_and_its_group():
    lay = tree_layout(3, [(1, 1)], branch=1, branch_group=2)
    assert lay.branch == 1 and lay.branch_group == (5, 2) and lay.groups == ((1, 7, 1),)
    #                     y1 y2 y3 B0 B1 GB GB G1      B = [z, y3] at the positions of y2, y3
    assert lay.offsets.tolist() == [0, 1, 2, 1, 2, 3, 4, 1]
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0],  # y1
        [1, 1, 0, 0, 0, 0, 0, 0],  # y2
        [1, 1, 1, 0, 0, 0, 0, 0],  # y3
        [1, 0, 0, 1, 0, 0, 0, 0],  # z: y1 and itself
        [1, 0, 0, 1, 1, 0, 0, 0],  # y3 after z
        [1, 0, 0, 1, 1, 1, 0, 0],  # the branch's group: y1, the whole branch, causal inside
        [1, 0, 0, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 0, 0, 0, 1],  # G1: y1 and itself
    ]
    assert lay.attend.int().tolist() == expected
    with pytest.raises(ValueError, match="branch"):
        tree_layout(3, [], branch=3)


def test_tree_attention_bias_sees_cache_and_pending():
    lay = tree_layout(1, [(0, 1), (1, 1)])  # y1, G0, G1
    bias = tree_attention_bias(cached=2, pending=2, attend=lay.attend)
    assert bias.shape == (1, 1, 5, 7) and bias.dtype == torch.float32
    allowed = (bias[0, 0] == 0).int().tolist()
    assert allowed == [
        # cache  pending  y1 G0 G1
        [1, 1, 1, 0, 0, 0, 0],  # pending 1
        [1, 1, 1, 1, 0, 0, 0],  # pending 2 (= c)
        [1, 1, 1, 1, 1, 0, 0],  # y1
        [1, 1, 1, 1, 0, 1, 0],  # G0
        [1, 1, 1, 1, 1, 0, 1],  # G1
    ]
    assert bias.min() == torch.finfo(torch.float32).min  # additive, not boolean
    assert tree_attention_bias(0, 1, lay.attend, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_choose_groups_all_pruned_and_budget():
    conf = torch.tensor([0.9, 0.5, 0.2])
    p = acceptance_probs(conf)
    assert p == pytest.approx([0.1, 0.45, 0.36, 0.09])
    assert choose_groups(conf, budget=20, width=7, limit=None) == [(j, 7) for j in range(4)]
    assert choose_groups(conf, budget=20, width=7, limit=2) == [(1, 7), (2, 7)]
    assert choose_groups(conf, budget=20, width=7, limit=1) == [(1, 7)]
    # a tie (P(n=0) = P(n=1) = 0.5) goes to the shorter acceptance, whose group also serves the longer one
    assert choose_groups(torch.tensor([0.5]), budget=20, width=7, limit=1) == [(0, 7)]
    # after accepting j and the correction the next cycle may propose budget − j − 1 tokens
    assert choose_groups(conf, budget=3, width=7, limit=None) == [(0, 2), (1, 1)]
    assert choose_groups(torch.zeros(0), budget=5, width=7, limit=2) == [(0, 4)]
    assert choose_groups(torch.zeros(0), budget=0, width=7, limit=None) == []


def test_cost_curve_is_a_line_through_the_multi_token_passes():
    # w = 1 (an AR step) is left out of the fit: 1 + 0.1·w through the others, noise and all
    c = CostCurve((1, 2, 4, 6, 8), (0.5, 1.2, 1.4, 1.6, 1.8))
    assert c.line == pytest.approx((1.0, 0.1))
    assert c(10) == pytest.approx(2.0) and c(40) == pytest.approx(5.0)
    noisy = CostCurve((1, 10, 20, 30, 40), (1.0, 2.0, 2.3, 2.2, 2.6))  # a dip at 30: 20 → 30 is not free
    assert noisy(30) - noisy(20) == pytest.approx(noisy(20) - noisy(10)) == pytest.approx(0.17)
    assert CostCurve((1, 2, 3), (1.0, 2.0, 1.0))(50) == pytest.approx(1.5)  # never sloping down
    assert CostCurve((1, 2), (1.0, 0.5))(9) == 1.0  # never under a one-token pass
    for widths, seconds in (((1,), (1.0,)), ((2, 1), (1.0, 2.0)), ((1, 2), (1.0,)), ((1, 2), (0.0, 1.0))):
        with pytest.raises(ValueError, match="cost curve"):
            CostCurve(widths, seconds)
    ws = cost_widths(8)
    assert ws[:3] == [1, 2, 4] and ws == sorted(set(ws))
    assert ws[-1] == 11 * 7 + 2  # y's, branch, its group and a group per acceptance length, with pending


def test_choose_groups_by_cost_flat_steep_and_in_between():
    conf = torch.tensor([0.9, 0.5, 0.2])  # P(n = j) = 0.1, 0.45, 0.36, 0.09
    everything = choose_groups(conf, budget=20, width=7, limit=None)
    flat = CostCurve((1, 100), (1.0, 1.0))
    steep = CostCurve((1, 100), (1.0, 100.0))
    kw = {"budget": 20, "width": 7, "base": 4, "tokens_per_pass": 5.0}
    assert choose_groups_by_cost(conf, cost=flat, **kw) == everything  # width is free: every group
    # the likeliest only, always, with the one placeholder a cycle needs (a row costs a quarter of the pass here)
    assert choose_groups_by_cost(conf, cost=steep, **kw) == [(1, 1)]
    # a pass of w costs 1 + 0.008·(w − 1): after G_1 (w = 11) another group costs 5.2% of the pass. G_2 would
    # bring P(n=2)·(T−1)/T = 0.36·0.8 = 0.29, but G_1 already carries all but 1 of its 7 proposals: 0.29/7 =
    # 0.041, dropped; G_0 has no group below it: 0.1·0.8 = 0.08, kept; G_3 (G_1 below: 2/7) 0.021, dropped
    mild = CostCurve((1, 101), (1.0, 1.8))
    assert choose_groups_by_cost(conf, cost=mild, **kw) == [(0, 7), (1, 7)]
    # a model that commits one token a pass gains nothing from a carried proposal: one row, the least a group has
    assert choose_groups_by_cost(conf, cost=mild, **{**kw, "tokens_per_pass": 1.0}) == [(1, 1)]
    assert choose_groups_by_cost(conf, cost=flat, **{**kw, "budget": 3}) == [(0, 2), (1, 1)]
    assert choose_groups_by_cost(torch.zeros(0), cost=steep, **{**kw, "budget": 0}) == []


def test_choose_groups_by_cost_cuts_the_rows_that_rarely_survive():
    """With the share of carried proposals accepted to each depth (``reach``), a group gets the placeholders
    that pay for themselves: row r is worth P(n = j)·R_{r+1}/T of a pass, a row costs 0.008/cost(w) of it."""
    conf = torch.tensor([0.9, 0.5, 0.2])  # P(n = j) = 0.1, 0.45, 0.36, 0.09
    mild = CostCurve((1, 101), (1.0, 1.8))
    kw = {"budget": 20, "width": 7, "base": 4, "tokens_per_pass": 5.0}
    reach = [0.9, 0.6, 0.3, 0.1, 0.02, 0.01, 0.005]
    # G_1: 0.45·R/5 against 0.008/1.024 keeps R ≥ 0.1, 4 rows (w = 8). G_2: G_1 already carries 3 of its rows and
    # its 4th (R = 0.1: 0.0072 < 0.0076) does not pay: dropped. G_0 (nothing below): 0.02·R keeps R ≥ 0.6, 2 rows.
    # G_3: G_1 carries 2 rows, the 3rd (0.018·0.3) does not pay: dropped
    assert choose_groups_by_cost(conf, cost=mild, reach=reach, **kw) == [(0, 2), (1, 4)]
    # the reach of a deeper position is at most a shallower one's: a noisy 0.3 at depth 6 changes nothing
    assert choose_groups_by_cost(conf, cost=mild, reach=[*reach[:5], 0.3, 0.3], **kw) == [(0, 2), (1, 4)]
    # where width is free every row is worth having
    flat = CostCurve((1, 100), (1.0, 1.0))
    assert choose_groups_by_cost(conf, cost=flat, reach=reach, **kw) == choose_groups(conf, 20, 7, None)
    # the budget still caps a group
    assert choose_groups_by_cost(conf, cost=flat, reach=reach, **{**kw, "budget": 3}) == [(0, 2), (1, 1)]
    # the net value of the rows, by hand: G_1's 4 rows at width 4
    m, net = rows_that_pay(0.45, reach, tokens_per_pass=5.0, cost=mild, width=4, most=7)
    assert m == 4 and net == pytest.approx(0.09 * 1.9 - 4 * 0.008 / 1.024)
    # a proposal rarely accepted past its first token is rarely accepted past its second: a noisy R_2 = 0.9
    # after R_1 = 0.05 buys nothing
    assert rows_that_pay(0.45, [0.05, 0.9, 0.9], tokens_per_pass=5.0, cost=mild, width=4, most=3)[0] == 1
    # rows another group carries are worth nothing here
    assert rows_that_pay(0.45, reach, tokens_per_pass=5.0, cost=mild, width=4, most=7, covered=7)[1] < 0


def test_measure_pass_cost_feeds_each_width_repeats_times(lm, monkeypatch):
    """After one pass over the context, ``repeats`` rounds over the widths (narrow to wide, then back), each pass
    feeding exactly w tokens (the last context token and a chain of w − 1) on top of the cached context; each
    width gets its own passes' time (a pass that costs 10 ms × w shows in its width's entry, whichever way the
    round ran). The clock is the test's own, advanced inside the pass only: no wall-clock bound to miss on a
    loaded machine."""
    from prove.decode.engine import pass_cost

    clock = [0.0]
    monkeypatch.setattr(pass_cost, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    fed: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        fed.append((kwargs["input_ids"].shape[1], cache.get_seq_length()))
        if cache.get_seq_length():
            clock[0] += 0.01 * kwargs["input_ids"].shape[1]

    handle = lm.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        t = measure_pass_cost(lm, [1, 4, 9], context=list(range(3, 23)), repeats=3)
    finally:
        handle.remove()
    assert fed == [(20, 0)] + [
        (1, 19),
        (4, 19),
        (9, 19),
        (9, 19),
        (4, 19),
        (1, 19),
        (1, 19),
        (4, 19),
        (9, 19),
    ]
    # each entry exactly its own width's cost: a time filed under another width, or two passes summed, fails
    assert list(t) == pytest.approx([0.01, 0.04, 0.09])


def test_measure_pass_cost_feeds_widths_wider_than_its_context(lm):
    """A pass may be wider than the calibration's context (the fused tree at K = 16 is 287 entries after 128
    cached tokens): it still feeds exactly w tokens, and the calibration of a K = 16 Decoder reaches that width."""
    fed: list[int] = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache.get_seq_length():
            fed.append(kwargs["input_ids"].shape[1])

    handle = lm.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        t = measure_pass_cost(lm, [1, 30, 64], context=list(range(3, 23)), repeats=1)
    finally:
        handle.remove()
    assert fed == [1, 30, 64] and len(t) == 3
    assert (
        widest_tree(16) == 287 and cost_widths(16)[-1] == 287 and cost_widths(8)[-1] == widest_tree(8) == 79
    )
    with pytest.raises(ValueError, match="context"):
        measure_pass_cost(lm, [1, 2], context=[])


def test_measure_pass_cost_times_the_plain_step_in_the_same_rounds(lm, monkeypatch):
    """``plain_step``: each round's first pass is followed by AR's own unmasked one-token step on the same runner,
    and its fastest time is the extra last entry. The masked passes cost 30 ms + 10 ms a token on the test's clock
    and the plain step 1 ms: a plain time filed under a width (the fastest counts) or a masked one under the plain
    entry shows."""
    from prove.decode.engine import pass_cost

    clock = [0.0]
    monkeypatch.setattr(pass_cost, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    fed: list[tuple[int, bool]] = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        plain = kwargs.get("attention_mask") is None
        if cache.get_seq_length():
            fed.append((kwargs["input_ids"].shape[1], plain))
            clock[0] += 0.001 if plain else 0.03 + 0.01 * kwargs["input_ids"].shape[1]

    handle = lm.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        t = measure_pass_cost(lm, [1, 4], context=list(range(3, 23)), repeats=3, plain_step=True)
    finally:
        handle.remove()
    masked, plain = (1, False), (1, True)
    assert fed == [masked, plain, (4, False), (4, False), plain, masked, masked, plain, (4, False)]
    assert list(t) == pytest.approx([0.04, 0.07, 0.001])


def test_auto_groups_follow_the_cost_curve(lm, tokenizer, prompts, refs):
    """``fuse_groups=auto`` with a flat curve plans a whole group for every acceptance length (as ``all``), with a
    steep one only the likeliest, one row long; the output is greedy either way, and the running tokens per pass
    and reach by depth move."""
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=4, fuse=True, fuse_groups="auto")
    prop = dec.proposer
    assert isinstance(prop, FusedBlockProposer) and isinstance(prop.cost, CostCurve)
    prior = prop.tokens_per_pass
    for curve, want in ((CostCurve((1, 100), (1.0, 1.0)), None), (CostCurve((1, 100), (1.0, 1e4)), 1)):
        prop.cost = curve
        plans = []

        def record(ev, plans=plans):
            budget = N - (len(ev.seq) - len(ev.committed) - ev.prompt_len) - 1  # the cycle's, as the engine's
            plans.append((list(prop.plan), ev.proposal.conf, budget))

        out = no_eos(dec, prompts[1], N, on_cycle=record)
        assert out.token_ids == refs[1][:N]
        for plan, conf, budget in plans:
            if want is None:
                assert plan == choose_groups(conf, budget, 3, None)
            else:  # the likeliest group, with the one row a carried proposal needs
                assert plan == [(j, 1) for j, _ in choose_groups(conf, budget, 3, want)]
    assert prop.tokens_per_pass != prior
    # in between, the plan prices each group against the width of the pass it would join: pending, the y's,
    # the second candidate's entries and its group
    prop.cost = CostCurve((1, 101), (1.0, 1.8))
    plans, orig = [], prop.propose
    # the reach by depth, kept independently: the share of carried proposals accepted to depth i (EMA)
    reach = list(prop.reach)
    last: list[list[int]] = [[]]

    def propose(seq, budget):
        new = prop._committed_since_carry(seq)
        if new is not None:
            n = 0
            while n < min(len(last[0]), len(new)) and last[0][n] == new[n]:
                n += 1
            for i in range(min(len(last[0]), len(reach))):
                reach[i] += YIELD_WEIGHT * ((1.0 if n > i else 0.0) - reach[i])
        proposal = orig(seq, budget)
        last[0] = proposal.tokens.tolist()
        assert prop.reach == pytest.approx(reach)
        plans.append((proposal, budget, list(prop.plan), prop.tokens_per_pass, prop.branch_plan, list(reach)))
        return proposal

    prop.propose = propose
    assert no_eos(dec, prompts[1], N).token_ids == refs[1][:N]
    sizes, rows, depths, branches = set(), set(), set(), set()
    for proposal, budget, plan, tpp, branch_plan, r in plans:
        k = proposal.k
        b = proposal.branch[0] if proposal.branch is not None else k
        if proposal.branch is not None:  # the branch's group: its rows priced as a group's at P(n = b)
            most = max(0, min(3, budget - k - 1))
            m, net = rows_that_pay(
                acceptance_probs(proposal.conf)[b],
                r,
                tokens_per_pass=tpp,
                cost=prop.cost,
                width=1 + k + (k - b),
                most=most,
            )
            assert branch_plan == (m if most and net >= 0 else 0)
            branches.add(branch_plan)
        base = 1 + k + (k - b) + branch_plan
        assert plan == choose_groups_by_cost(
            proposal.conf, budget, 3, base=base, cost=prop.cost, tokens_per_pass=tpp, reach=r
        )
        sizes.add(len(plan))
        rows.update(m for _, m in plan)
        depths.add(tuple(r))
    assert len(sizes) > 1  # the curve is mild enough that the choice varies
    assert len(depths) > 1 and rows != {3}  # the reach moves, and groups are cut short of K − 1 rows
    assert branches and branches != {3}  # second candidates were planned, their groups cut too
    with pytest.raises(ValueError, match="pass-cost curve"):
        FusedBlockProposer(prop.runner, prop.mask_token_id, 4, groups="auto")


# -- G_j is a separate block pass from the context ending at y_j --------------------------------------------------


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("cached", [0, 2])
@pytest.mark.parametrize("K", [5, 16])
def test_group_j_equals_a_block_pass_from_the_context_ending_at_y_j(
    make_lm, tokenizer, prompts, attn, cached, K
):
    """Row j of the tree pass (at y_j) is the block pass's position 1 (g_{j+1}) and G_j's rows its positions
    2..K, for every j; the y rows are a plain causal pass over [context, y_1..y_k]. K = 16 (ProVe's block
    size): a tree of 15 y's and 16 groups, 255 entries, wider than the context."""
    lm = make_lm(seed=0, attn=attn)
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    ctx = prompts[3]
    ys = [
        int(t)
        for t in torch.randint(0, len(tokenizer) - 1, (K - 1,), generator=torch.Generator().manual_seed(1))
    ]
    k = len(ys)
    runner = ModelRunner(lm)
    if cached:  # a cache that ends `cached` tokens before the context does: pending = those tokens
        runner.forward(ctx[: len(ctx) - cached])
    lay = tree_layout(k, [(j, K - 1) for j in range(k + 1)])
    extra = ys + [mask_id] * (lay.width - k)
    out = runner.forward_tree(ctx, extra, offsets=lay.offsets, attend=lay.attend, chain=k)
    assert out.shape[0] == lay.width + 1
    L = len(ctx)
    with torch.no_grad():
        plain = lm(torch.tensor([ctx + ys])).logits[0]
        assert_logits_match(out[: k + 1], plain[L - 1 :], lm, context=len(ctx) + out.shape[0])
        for j, start, m in lay.groups:
            block = lm(torch.tensor([ctx + ys[:j] + [mask_id] * (K - 1)])).logits[0]  # the block pass
            assert_logits_match(out[j], block[L + j - 1], lm, context=len(ctx) + out.shape[0])  # position 1
            assert_logits_match(
                out[1 + start : 1 + start + m], block[L + j :], lm, context=len(ctx) + out.shape[0]
            )


def test_one_runner_reuses_a_tree_at_other_cache_lengths_and_pending_counts(lm, tokenizer, prompts):
    """The runner builds a tree's positions and mask once and reuses them: the same tree fed again after the
    cache grew, with one and with several pending tokens, still gives the plain and block passes' logits."""
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    ctx, ys, m = prompts[3], [7, 11], 3
    lay = tree_layout(len(ys), [(0, m), (2, m)])
    extra = ys + [mask_id] * (lay.width - len(ys))
    runner = ModelRunner(lm)
    for end, pending in [(6, 6), (9, 3), (10, 1), (12, 2), (13, 1)]:
        seq = ctx[:end]
        runner.sync(seq)
        assert end - runner.cached == pending
        out = runner.forward_tree(seq, extra, offsets=lay.offsets, attend=lay.attend, chain=len(ys))
        with torch.no_grad():
            plain = lm(torch.tensor([seq + ys])).logits[0]
            assert_logits_match(out[: len(ys) + 1], plain[end - 1 :], lm, context=len(seq) + out.shape[0])
            for j, start, size in lay.groups:
                block = lm(torch.tensor([seq + ys[:j] + [mask_id] * size])).logits[0]
                assert_logits_match(
                    out[1 + start : 1 + start + size], block[end + j :], lm, context=len(seq) + out.shape[0]
                )


@pytest.mark.parametrize("b", [0, 2])
def test_the_branch_is_a_plain_pass_and_its_group_a_block_pass_after_it(make_lm, tokenizer, prompts, b):
    """The branch rows are a causal pass over [context, y_1..y_b, z, y_{b+2}..y_k] and the branch group's rows
    are a block pass after that whole path; the y rows and the groups are unchanged by the branch."""
    lm = make_lm(seed=0, attn="eager")
    mask_id, K = tokenizer.convert_tokens_to_ids("<|mask|>"), 5
    ctx, ys, z = prompts[3], [11, 12, 13, 14], 15
    k = len(ys)
    runner = ModelRunner(lm)
    lay = tree_layout(k, [(j, K - 1) for j in range(k + 1)], branch=b, branch_group=K - 1)
    path = ys[:b] + [z] + ys[b + 1 :]
    extra = ys + path[b:] + [mask_id] * (lay.width - k - (k - b))
    out = runner.forward_tree(ctx, extra, offsets=lay.offsets, attend=lay.attend, chain=k)
    L = len(ctx)
    with torch.no_grad():
        assert_logits_match(
            out[: k + 1], lm(torch.tensor([ctx + ys])).logits[0, L - 1 :], lm, context=len(ctx) + out.shape[0]
        )
        along = lm(torch.tensor([ctx + path])).logits[0]
        assert_logits_match(out[1 + k : 1 + k + (k - b)], along[L + b :], lm, context=len(ctx) + out.shape[0])
        start, m = lay.branch_group
        block = lm(torch.tensor([ctx + path + [mask_id] * (K - 1)])).logits[0]
        assert_logits_match(
            out[1 + start : 1 + start + m], block[L + k :], lm, context=len(ctx) + out.shape[0]
        )
        for j, start, m in lay.groups:
            block = lm(torch.tensor([ctx + ys[:j] + [mask_id] * (K - 1)])).logits[0]
            assert_logits_match(
                out[1 + start : 1 + start + m], block[L + j :], lm, context=len(ctx) + out.shape[0]
            )


# -- decoding: identical to greedy, one pass per cycle ------------------------------------------------------------


@pytest.mark.parametrize("groups", ["all", 1, 2, "auto"])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_fused_prove_lossless_equals_hf_generate(lm, tokenizer, prompts, refs, k, groups):
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=k, fuse=True, fuse_groups=groups)
    for p, ref in zip(prompts, refs, strict=True):
        for n in (1, 9, N):
            out = no_eos(dec, p, n)
            assert out.token_ids == ref[:n], (k, groups, n)
            s = out.stats
            assert s.model_passes == s.cycles and s.verifier_passes == 0 == s.draft_passes  # one pass a cycle
            assert s.new_tokens == n == sum(s.committed_per_cycle)


def test_fused_carries_a_proposal_into_every_cycle_but_the_first(lm, tokenizer, prompts, refs):
    """With a group for every acceptance length, every cycle after the first proposes (the last one only
    if budget is left); a random model's placeholders rarely guess right, so here that is all we check."""
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=4, fuse=True, fuse_groups="all")
    s = no_eos(dec, prompts[0], N).stats
    assert (
        s.proposed_by_depth[0] == s.cycles - 2
    )  # not the first cycle, nor the last (budget 0: one token left)
    assert s.model_passes == s.cycles


class ScriptedFused(FusedBlockProposer):
    """The real tree pass, but the carried groups are replaced by the true greedy continuation ``ref``
    (corrupted at ``wrong``, indices into the new tokens): high acceptance through the fused machinery.
    ``second``: at a wrong index the true token is the proposer's second choice (p̃ ≈ 0.73 < 0.9, so with
    branches on it becomes the cycle's second candidate)."""

    def __init__(self, *a, prompt_len: int, ref: list[int], wrong: set[int], second: bool = False, **kw):
        super().__init__(*a, **kw)
        self.prompt_len, self.ref, self.wrong, self.second = prompt_len, ref, wrong, second

    def receive(self, seq, groups):
        super().receive(seq, [(path, self._script(len(seq) + len(path), g.shape[0])) for path, g in groups])

    def _script(self, end: int, m: int) -> torch.Tensor:
        """Logits (m, V) for a group whose context ends at sequence length ``end`` (its rows predict the new
        tokens after the one at ``end``)."""
        vocab = self.runner.vocab_size
        at = end - self.prompt_len + 1  # the new-token index of the group's first prediction
        idx = range(at, at + m)
        truth = [self.ref[i] if i < len(self.ref) else 0 for i in idx]
        ids = [(t + 1) % vocab if i in self.wrong else t for i, t in zip(idx, truth, strict=True)]
        rows = torch.nn.functional.one_hot(torch.tensor(ids), vocab).float() * 20
        if self.second:
            for r, (i, t) in enumerate(zip(idx, truth, strict=True)):
                if i in self.wrong:
                    rows[r, t] = 19.0
        return rows


def scripted_decoder(
    lm, tokenizer, prompt, ref, wrong, k, groups="all", second=False, branch=False
) -> Decoder:
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=k, fuse=True, fuse_groups=groups)
    old = dec.proposer
    assert isinstance(old, FusedBlockProposer)
    new = ScriptedFused(
        old.runner,
        old.mask_token_id,
        k,
        groups=old.groups,
        allowed=old.allowed,
        branches=branch,
        prompt_len=len(prompt),
        ref=ref,
        wrong=wrong,
        second=second,
    )
    dec.proposer = dec.verifier.proposer = new  # type: ignore[attr-defined]
    return dec


@pytest.mark.parametrize("groups", ["all", 1])
@pytest.mark.parametrize("k", [4, 8])
def test_a_second_candidate_rescues_a_wrong_token_in_the_same_pass(lm, tokenizer, prompts, refs, k, groups):
    """Where the proposer's first choice is wrong and its second is the greedy token, the branch commits
    the whole block in that one pass (and the output is still exactly greedy)."""
    p, ref = prompts[0], refs[0]
    wrong = {6, 15, 27}
    cycles = []
    plain = no_eos(scripted_decoder(lm, tokenizer, p, ref, wrong, k, groups, second=True), p, N)
    rescued = no_eos(
        scripted_decoder(lm, tokenizer, p, ref, wrong, k, groups, second=True, branch=True),
        p,
        N,
        on_cycle=lambda ev, seen=cycles: seen.append((ev.proposal.branch, ev.proposal.k, ev.accept)),
    )
    assert plain.token_ids == rescued.token_ids == ref
    branched = [(br, kk, acc) for br, kk, acc in cycles if br is not None]
    assert branched and all(acc.path is not None and acc.n == kk for br, kk, acc in branched), branched
    assert rescued.stats.model_passes < plain.stats.model_passes


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_scripted_high_acceptance_stays_lossless_with_one_pass_per_cycle(lm, tokenizer, prompts, refs, k):
    for p, ref in zip(prompts, refs, strict=True):
        out = no_eos(scripted_decoder(lm, tokenizer, p, ref, {3, 4, 11, 25}, k), p, N)
        assert out.token_ids == ref
        assert out.stats.model_passes == out.stats.cycles
    p, ref = prompts[0], refs[0]
    perfect = no_eos(scripted_decoder(lm, tokenizer, p, ref, set(), k), p, N).stats
    # first cycle: the block pass as an AR step (1 token); then K−1 carried proposals + bonus = K a pass
    assert perfect.committed_per_cycle[:3] == [1, k, k]
    assert perfect.tokens_per_cycle > (k + 1) / 2


def _first_new_token_at(ref: list[int], lo: int) -> int:
    return next(i for i in range(lo, len(ref)) if ref[i] not in ref[:i])


@pytest.mark.parametrize("scripted", [True, False])
def test_fused_eos_inside_a_block_ends_where_ar_does(lm, tokenizer, prompts, refs, scripted):
    p, ref = prompts[1], refs[1]
    e = _first_new_token_at(ref, 5)
    expected = hf_generate(lm, p, N, eos=ref[e], suppress=mask_ids(tokenizer))
    assert expected == ref[: e + 1]
    if scripted:
        dec = scripted_decoder(lm, tokenizer, p, ref, set(), 8)
    else:
        dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=8, fuse=True)
    out = dec.generate(p, max_new_tokens=N, eos_token_id=ref[e])
    assert out.token_ids == expected
    if scripted:  # the EOS was inside an accepted block: the cycle that reached it committed > 1 token
        assert out.stats.committed_per_cycle[-1] > 1


@pytest.mark.parametrize("n", [1, 7, 17])
def test_fused_max_new_tokens_inside_a_block(lm, tokenizer, prompts, refs, n):
    p, ref = prompts[0], refs[0]
    out = no_eos(scripted_decoder(lm, tokenizer, p, ref, {9}, 8), p, n)
    assert out.token_ids == ref[:n] == hf_generate(lm, p, n, suppress=mask_ids(tokenizer))


def test_fused_stop_string_inside_a_block_ends_where_ar_does(lm, tokenizer, prompts, refs):
    p, ref = prompts[0], refs[0]
    stop = tokenizer.decode(ref[12:14])
    j = next(i for i in range(len(ref)) if stop in tokenizer.decode(ref[: i + 1]))
    ar = no_eos(Decoder(lm, tokenizer, method="ar"), p, N, stop=[stop])
    fused = no_eos(scripted_decoder(lm, tokenizer, p, ref, set(), 8), p, N, stop=[stop])
    plain = no_eos(
        Decoder(lm, tokenizer, method="prove-lossless", block_size=8, fuse=True), p, N, stop=[stop]
    )
    assert ar.token_ids == fused.token_ids == plain.token_ids == ref[: j + 1]


@pytest.mark.parametrize("scripted", [True, False])
@pytest.mark.parametrize("groups", ["all", 2])
@pytest.mark.parametrize("K", [4, 16])
def test_fused_cache_holds_exactly_the_committed_prefix_after_every_cycle(
    lm, tokenizer, prompts, refs, scripted, groups, K
):
    pending: list[int] = []

    def check(ev):
        for runner in ev.models.runners():
            _check_cache(runner, ev.seq)
        pending.append(len(ev.seq) - ev.models.target.valid)

    p, ref = prompts[3], refs[3]
    if scripted:
        dec = scripted_decoder(lm, tokenizer, p, ref, {5, 6, 20}, K, groups)
    else:
        dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=K, fuse=True, fuse_groups=groups)
    with torch.no_grad():
        out = no_eos(dec, p, N, on_cycle=check)
    assert out.token_ids == ref[:N]
    assert len(pending) == out.stats.cycles
    assert set(pending) == {1}  # context + accepted y's are cached; only the correction / bonus waits


def test_mask_token_as_a_greedy_token_is_never_taken_for_a_group_entry(lm, tokenizer, prompts):
    """Group entries are recorded as -1 in the runner's ``fed``: even when the committed token equals the
    mask token, the cache keeps only the y entries (a group entry sits at another position)."""
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    runner = ModelRunner(lm)
    ctx = prompts[0]
    lay = tree_layout(1, [(0, 2), (1, 2)])
    ys = [5]
    runner.forward_tree(ctx, ys + [mask_id] * 4, offsets=lay.offsets, attend=lay.attend, chain=1)
    runner.sync(ctx + ys + [mask_id])  # y_1 accepted, then the "correction" happens to be <|mask|>
    assert runner.valid == len(ctx) + 1 == runner.cached
    _check_cache(runner, ctx + ys + [mask_id])


def test_a_miss_carries_the_rest_of_the_nearest_earlier_group():
    """After the tree pass the committed tokens are y_1..y_p, then others (a correction, or an accepted
    branch and its correction): the carried proposal is G_j's rows from (tokens committed − 1) − j on, for
    the largest j ≤ p in J (those rows predict the tokens after the last committed one; the positions
    between y_j and them are placeholders in G_j); nothing when no group lies at or before p, or when G_j
    has no row left."""
    V, base, ys = 11, [1, 2, 3], [4, 5, 6, 7]
    rows = {0: [1, 2, 3, 4, 5], 2: [6, 7, 8]}  # the argmax of each row of G_0 (m=5) and G_2 (m=3)
    groups = {j: torch.nn.functional.one_hot(torch.tensor(r), V).float() * 9 for j, r in rows.items()}
    cpu = types.SimpleNamespace(device=torch.device("cpu"))  # all propose reads of its runner
    prop = FusedBlockProposer(cpu, mask_token_id=10, block_size=6, groups=2)  # type: ignore[arg-type]

    def carried(committed, budget=20, g=groups):
        prop.receive(base, [(ys[:j], logits) for j, logits in g.items()])
        return prop.propose(base + committed, budget=budget).tokens.tolist()

    expected = {0: [1, 2, 3, 4, 5], 1: [2, 3, 4, 5], 2: [6, 7, 8], 3: [7, 8], 4: [8]}
    for n in range(len(ys) + 1):
        assert carried(ys[:n] + [9]) == expected[n], n
    assert carried([9], g={2: groups[2]}) == []  # n = 0: no group at or before it
    assert carried([5, 9]) == [2, 3, 4, 5]  # y_1 rejected, then one more token: G_0 from its row 1
    assert carried([5, 9], g={2: groups[2]}) == []
    assert carried([4, 5, 8, 7, 9]) == [8]  # y_1, y_2, a branch token, y_4, a correction: G_2 from row 2
    assert carried(ys[:1] + [9], budget=2) == [2, 3]  # the budget cuts it
    prop.receive(base, [(ys[:j], logits) for j, logits in groups.items()])
    assert prop.propose([1, 2, 0, 4, 9], budget=20).tokens.numel() == 0  # not the pass's committed prefix


def test_fused_never_commits_or_proposes_the_mask_token(lm, tokenizer, prompts):
    """A model whose greedy argmax is <|mask|> now and then (its output row copies a frequent token's,
    scaled up): fused decoding gives the greedy tokens with <|mask|> suppressed, as AR and unfused do."""
    import copy

    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    p = prompts[0]
    free = hf_generate(lm, p, N)
    frequent = max(set(free), key=free.count)
    m = copy.deepcopy(lm)
    with torch.no_grad():
        w = m.get_output_embeddings().weight
        w[mask_id] = w[frequent] * 1.5
    assert mask_id in hf_generate(m, p, N)  # the case this test is about happens
    expected = hf_generate(m, p, N, suppress=mask_ids(tokenizer))
    for kw in ({"fuse": True, "fuse_groups": "all"}, {"fuse": True, "fuse_groups": 1}, {"fuse": False}):
        dec = Decoder(m, tokenizer, method="prove-lossless", block_size=4, **kw)
        traced: list[list[int]] = []
        out = no_eos(dec, p, N, on_cycle=lambda ev, seen=traced: seen.append(ev.proposal.tokens.tolist()))
        assert out.token_ids == expected, kw
        assert traced and all(mask_id not in t for t in traced), kw


# -- other methods, the interface ----------------------------------------------------------------------------------


def test_fused_exact_settings_of_nsd_and_asd_on_the_block_proposer_equal_ar(lm, tokenizer, prompts, refs):
    for method, kw in (("nsd", {"theta": 0.0}), ("asd", {"budget": 0.0})):
        dec = Decoder(lm, tokenizer, method=method, proposer="block", block_size=4, fuse=True, **kw)
        out = no_eos(dec, prompts[2], 30)
        assert out.token_ids == refs[2][:30], method
        assert out.stats.model_passes == out.stats.cycles


def test_fuse_is_refused_where_it_does_not_apply(lm, small, tokenizer):
    with pytest.raises(ValueError, match="fuse=true needs block proposals"):
        Decoder(lm, tokenizer, method="prove", verifier=small, block_size=4, fuse=True)
    with pytest.raises(ValueError, match="fuse=true needs block proposals"):
        Decoder(lm, tokenizer, method="mars", block_size=4, fuse=True)
    with pytest.raises(ValueError, match="greedy"):
        Decoder(lm, tokenizer, method="nsd", proposer="block", block_size=4, fuse=True, temperature=0.7)
    for bad in (0, -1, "some", 1.5, True):
        with pytest.raises(ValueError, match="fuse_groups"):
            Decoder(lm, tokenizer, method="prove-lossless", block_size=4, fuse=True, fuse_groups=bad)
    assert DecodeParams(fuse_groups="3").fuse_groups == 3
    assert DecodeParams(fuse_groups="auto").fuse_groups == "auto"
    assert get_method("prove-lossless").can_fuse and not get_method("sd").can_fuse
    assert {"fuse", "fuse_groups"} <= set(get_method("nsd").with_proposer("block").uses)
    assert "fuse" not in get_method("prove-lossless").with_proposer("draft").uses


def test_fuse_on_the_command_line():
    from tests.decode.test_cli import config

    cfg = config("model=M", "prompts=P", "output=O", "method=prove-lossless", "fuse=true", "fuse_groups=3")
    assert cfg.fuse is True and cfg.fuse_groups == 3
    assert config("model=M", "prompts=P", "output=O", "fuse=true", "fuse_groups=all").fuse_groups == "all"


# -- the bench: fused and unfused rows side by side, the pass cost curve ---------------------------------------------


def test_bench_rows_fused_and_unfused_side_by_side():
    from prove.decode.bench.rows import expand_rows

    uses = {"ar": (), "prove-lossless": ("block_size", "fuse", "fuse_groups"), "mars": ("tau", "block_size")}
    rows = expand_rows(
        ["prove-lossless", "mars"], {"fuse": [False, True], "fuse_groups": ["all", 2, 3]}, uses
    )
    assert [(r.name, r.params) for r in rows] == [
        ("ar", {}),
        ("prove-lossless unfused", {"fuse": False}),  # once, not once per J
        ("prove-lossless fused J=all", {"fuse": True, "fuse_groups": "all"}),
        ("prove-lossless fused J=2", {"fuse": True, "fuse_groups": 2}),
        ("prove-lossless fused J=3", {"fuse": True, "fuse_groups": 3}),
        ("mars", {}),
    ]


def test_pass_cost_curve_and_its_table(lm):
    from prove.decode.bench.report import render_pass_cost
    from prove.decode.bench.run import pass_cost

    cost = pass_cost(lm, [5, 6, 7], widths=12, context=20, repeats=1)
    assert cost["widths"] == list(range(1, 13)) and len(cost["ms"]) == 12
    assert all(t > 0 for t in cost["ms"]) and cost["plain_t1_ms"] > 0
    md = render_pass_cost(cost)
    assert "Pass cost t(w)/t(1)" in md and "| 1 | 1.00 |" in md and "\n| 11 |" in md


def test_plots_take_fused_and_unfused_rows(tmp_path):
    """The speed / accuracy plot takes a sweep mixing fuse (bool) and fuse_groups (all or m): its points are
    ordered numbers first, then ``all`` (sorting the raw values would raise on 2 < "all")."""
    from prove.decode.bench.plots import PLOTS, _sort_key, write_plots

    from tests.decode.decode_helpers import hand_report

    assert sorted([2, "all", True, 0.5], key=_sort_key) == [0.5, True, 2, "all"]

    report = hand_report()
    base = report["rows"][1]
    for i, swept in enumerate(
        ({"fuse": False}, {"fuse": True, "fuse_groups": "all"}, {"fuse": True, "fuse_groups": 2})
    ):
        name = "prove-lossless " + " ".join(map(str, swept.values()))
        report["rows"].append(
            {**base, "name": name, "method": "prove-lossless", "swept": swept, "speedup_total": 1 + i / 10}
        )
    assert set(write_plots(report, tmp_path)) == set(PLOTS)
