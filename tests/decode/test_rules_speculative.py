"""Speculative-decoding family rules (decode/rules/speculative.py).

Pyramid: hand-made logits with exact tokens → property tests over many random logits →
Monte-Carlo distribution tests on toy vocabularies (fixed-context tables p(x_t | x_{t-1})),
vectorised through the batched rule core. Everything is seeded.
"""

from __future__ import annotations

import pytest
import torch
from prove.decode.rules import Accept
from prove.decode.rules.speculative import (
    AsdState,
    asd_greedy,
    nsd_greedy,
    nsd_sample,
    nucleus_mask,
    sample_from_probs,
    sd_greedy,
    sd_sample,
    speculative_accept_batch,
    warp_probs,
)

NEG = -1e4


def onehot_logits(ids: list[int], V: int, hi: float = 5.0) -> torch.Tensor:
    z = torch.zeros(len(ids), V)
    z[torch.arange(len(ids)), torch.tensor(ids)] = hi
    return z


def rows(*ps: list[float]) -> torch.Tensor:
    return torch.tensor(ps, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------
# helpers: nucleus, warping, inverse-CDF sampling
# ------------------------------------------------------------------------------------------------


def test_nucleus_includes_crossing_token_and_edge_thresholds():
    p = torch.tensor([0.1, 0.5, 0.3, 0.1, 0.0])
    assert nucleus_mask(p, 0.0).tolist() == [False] * 5  # θ = 0: empty
    assert nucleus_mask(p, 1e-6).tolist() == [False, True, False, False, False]  # top token
    assert nucleus_mask(p, 0.5).tolist() == [False, True, False, False, False]  # reaches θ exactly
    assert nucleus_mask(p, 0.6).tolist() == [False, True, True, False, False]  # crossing token in
    assert nucleus_mask(p, 0.85).tolist() == [True, True, True, False, False]  # tie → lower index
    assert nucleus_mask(p, 1.0).tolist() == [True, True, True, True, False]  # support, not p = 0


def test_warp_probs_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3
    for t, p, k in [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 1.0, 7), (1.3, 0.8, 0), (0.6, 0.9, 12)]:
        ref = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if p < 1:
            ref = TopPLogitsWarper(p)(None, ref)
        torch.testing.assert_close(warp_probs(logits, t, p, k), ref.softmax(-1), atol=1e-6, rtol=0)
    greedy = warp_probs(logits, temperature=0.0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.all(greedy.sum(-1) == 1)
    with pytest.raises(ValueError, match="top_p"):
        warp_probs(logits, top_p=0.0)


def test_sample_from_probs_is_inverse_cdf_and_skips_zero_mass():
    p = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999999, 1.0 - 2**-24])
    assert sample_from_probs(p.expand(5, 5), u).tolist() == [1, 1, 3, 3, 3]
    assert int(sample_from_probs(p * 7, torch.tensor(0.3))) == 3  # unnormalised is fine


# ------------------------------------------------------------------------------------------------
# greedy SD: hand-made logits, exact tokens
# ------------------------------------------------------------------------------------------------


def test_sd_greedy_always_never_partly():
    V = 8
    target = onehot_logits([3, 1, 4, 1, 5, 7], V)  # greedy tokens at k+1 = 6 positions
    assert sd_greedy(torch.tensor([3, 1, 4, 1, 5]), target) == Accept(5, 7)  # all + bonus
    assert sd_greedy(torch.tensor([2, 1, 4, 1, 5]), target) == Accept(0, 3)  # none + correction
    assert sd_greedy(torch.tensor([3, 1, 0, 1, 5]), target) == Accept(2, 4)  # partly
    assert sd_greedy(torch.tensor([3, 1, 0, 1, 5]), target).committed == 3


# ------------------------------------------------------------------------------------------------
# sampling SD: hand-made distributions, exact tokens under given uniforms
# ------------------------------------------------------------------------------------------------


def test_sd_sample_always_accepted_when_draft_equals_target():
    p = rows([0.5, 0.5, 0, 0], [0, 0.3, 0.7, 0], [0, 0, 0, 1.0])
    u = torch.tensor([0.999, 0.999, 0.0])
    assert sd_sample(torch.tensor([1, 2]), p[:2], p, uniforms=u) == Accept(2, 3)  # bonus from p_3


def test_sd_sample_never_accepted_on_disjoint_support():
    q = rows([0, 0, 1.0, 0], [0, 0, 0, 1.0])
    p = rows([0.25, 0.75, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0])
    for u0, want in [(0.1, 0), (0.3, 1)]:  # residual = p_1 exactly
        u = torch.tensor([0.0, 0.0, u0])  # u = 0 still rejects: p(y) = 0
        assert sd_sample(torch.tensor([2, 3]), q, p, uniforms=u) == Accept(0, want)


def test_sd_sample_partly_accepted_exact_residual():
    # y_1 accepted with prob p/q = 0.4/0.8 = 0.5, y_2 never (p = 0); residual at row 2 is one token
    q = rows([0.2, 0.8, 0, 0], [0, 0, 0.5, 0.5])
    p = rows([0.6, 0.4, 0, 0], [0, 0, 1.0, 0], [0.25, 0.25, 0.25, 0.25])
    y = torch.tensor([1, 3])
    assert sd_sample(y, q, p, uniforms=torch.tensor([0.49, 0.0, 0.9])) == Accept(1, 2)
    # u_1 = 0.51 rejects y_1: residual max(0, p_1 − q_1) = [0.4, 0, 0, 0] → token 0
    assert sd_sample(y, q, p, uniforms=torch.tensor([0.51, 0.0, 0.9])) == Accept(0, 0)


def test_empty_block_is_a_plain_draw_from_the_target():
    p = rows([0.0, 0.25, 0.75])
    y = torch.zeros(0, dtype=torch.long)
    for u0, want in [(0.1, 1), (0.5, 2)]:
        u = torch.tensor([u0])
        assert (
            sd_sample(y, p[:0], p, uniforms=u) == nsd_sample(y, p[:0], p, 0.9, uniforms=u) == Accept(0, want)
        )
    z = torch.log(p.clamp_min(1e-9))
    assert sd_greedy(y, z) == nsd_greedy(y, z, 0.5) == asd_greedy(y, z, AsdState())[0] == Accept(0, 2)


def test_sd_sample_generator_is_reproducible_and_validates_uniforms():
    g = torch.Generator().manual_seed(0)
    q = torch.rand(3, 6, generator=g).softmax(-1)
    p = torch.rand(4, 6, generator=g).softmax(-1)
    y = torch.tensor([0, 4, 5])
    a = [sd_sample(y, q, p, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    b = [sd_sample(y, q, p, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    assert a == b and len(set(a)) > 1
    with pytest.raises(ValueError, match="k\\+1"):
        sd_sample(y, q, p, uniforms=torch.rand(3))


# ------------------------------------------------------------------------------------------------
# Monte-Carlo: sampling SD preserves the target's sequence distribution
# ------------------------------------------------------------------------------------------------


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson chi-square over cells with positive expected count; samples in zero cells fail."""
    n = counts.sum()
    pos = probs > 0
    assert counts[~pos].sum() == 0, "samples landed where the target has zero probability"
    exp = n * probs[pos].double()
    stat = float(((counts[pos].double() - exp) ** 2 / exp).sum())
    df = int(pos.sum()) - 1
    return stat, float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def run_speculative_chains(P, Q, *, length, k, n_samples, seed, theta=0.0, start=0):
    """Vectorised SD over ``n_samples`` independent requests on bigram tables.

    P, Q: (V, V) with P[a, b] = p(x_t = b | x_{t-1} = a). Each cycle drafts k tokens from Q, scores
    with P, applies ``speculative_accept_batch`` and commits n tokens + the extra one. Returns the
    first ``length`` generated tokens per request, (n_samples, length).
    """
    g = torch.Generator().manual_seed(seed)
    N = n_samples
    out = torch.full((N, length + k + 1), -1, dtype=torch.long)
    pos = torch.zeros(N, dtype=torch.long)
    last = torch.full((N,), start, dtype=torch.long)
    arange = torch.arange(N)
    while bool((pos < length).any()):
        # 1) propose k tokens from the draft table
        ys, qs, ctx = [], [], last
        for _ in range(k):
            q = Q[ctx]  # (N, V)
            y = torch.multinomial(q, 1, generator=g).squeeze(-1)
            ys.append(y)
            qs.append(q)
            ctx = y
        tokens = torch.stack(ys, -1)  # (N, k)
        draft = torch.stack(qs, -2)  # (N, k, V)
        # 2) score: the target at every position, incl. the bonus one
        target = P[torch.cat([last[:, None], tokens], -1)]  # (N, k+1, V)
        # 3) accept
        n, extra = speculative_accept_batch(tokens, draft, target, torch.rand(N, k + 1, generator=g), theta)
        # 4) commit
        committed = torch.cat([tokens, torch.zeros(N, 1, dtype=torch.long)], -1)
        committed[arange, n] = extra
        live = pos < length
        for j in range(k + 1):
            m = live & (j <= n)
            out[arange[m], pos[m] + j] = committed[m, j]
        last = torch.where(live, committed[arange, n], last)
        pos = torch.where(live, pos + n + 1, pos)
    return out[:, :length]


def sequence_probs(P: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """Exact p(x_1..x_L | x_0 = start) for all V^L sequences, flattened in base-V order."""
    dist = P[start]  # (V,)
    for _ in range(length - 1):
        last = torch.arange(P.shape[0]).repeat(dist.numel() // P.shape[0])  # last token of each prefix
        dist = (dist[:, None] * P[last]).reshape(-1)
    return dist


def seq_index(seqs: torch.Tensor, V: int) -> torch.Tensor:
    w = V ** torch.arange(seqs.shape[-1] - 1, -1, -1)
    return (seqs * w).sum(-1)


def _tables(V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    P = (torch.randn(V, V, generator=g) * 1.5).softmax(-1)
    P[:, -1] = 0  # the target never emits the last token ...
    P = P / P.sum(-1, keepdim=True)
    rand_q = (torch.randn(V, V, generator=g) * 1.5).softmax(-1)  # ... while this draft often does
    onehot = torch.nn.functional.one_hot(torch.arange(V).roll(1), V).float()  # a fixed wrong token
    disjoint = torch.zeros(V, V)
    disjoint[:, -1] = 1.0  # all mass where the target has none
    return P, {"random": rand_q, "onehot": onehot, "disjoint": disjoint, "equal": P.clone()}


@pytest.mark.parametrize("draft_kind", ["random", "onehot", "disjoint", "equal"])
def test_sd_sampling_preserves_target_sequence_distribution(draft_kind):
    V, L, k, N = 4, 3, 2, 60_000
    P, drafts = _tables(V, seed=1)
    Q = drafts[draft_kind]
    seqs = run_speculative_chains(P, Q, length=L, k=k, n_samples=N, seed=2)
    counts = torch.bincount(seq_index(seqs, V), minlength=V**L)
    exact = sequence_probs(P, L)
    stat, pval = chi2_pvalue(counts, exact)
    dist_tv = tv(counts / N, exact)
    print(f"SD[{draft_kind}] V={V} L={L} k={k} N={N}: chi2={stat:.1f} p={pval:.3f} TV={dist_tv:.4f}")
    assert pval > 1e-3 and dist_tv < 0.02


def test_monte_carlo_has_power_to_catch_a_biased_rule():
    """Same harness, NSD with a large θ (not lossless): the chi-square test must reject it."""
    V, L, k, N = 4, 3, 2, 60_000
    P, drafts = _tables(V, seed=1)
    seqs = run_speculative_chains(P, drafts["random"], length=L, k=k, n_samples=N, seed=2, theta=0.9)
    counts = torch.bincount(seq_index(seqs, V), minlength=V**L)
    _, pval = chi2_pvalue(counts, sequence_probs(P, L))
    assert pval < 1e-6


def test_sd_sampling_preserves_warped_target():
    """Temperature + top-k + top-p applied to both tables alike: SD samples the warped target."""
    V, L, k, N = 5, 2, 3, 50_000
    g = torch.Generator().manual_seed(3)
    zp, zq = torch.randn(V, V, generator=g) * 2, torch.randn(V, V, generator=g) * 2
    P, Q = warp_probs(zp, 0.8, 0.9, 4), warp_probs(zq, 0.8, 0.9, 4)
    seqs = run_speculative_chains(P, Q, length=L, k=k, n_samples=N, seed=4)
    counts = torch.bincount(seq_index(seqs, V), minlength=V**L)
    stat, pval = chi2_pvalue(counts, sequence_probs(P, L))
    assert pval > 1e-3, (stat, pval)


# ------------------------------------------------------------------------------------------------
# NSD
# ------------------------------------------------------------------------------------------------


def _random_blocks(B: int, k: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    draft = (torch.randn(B, k, V, generator=g) * 2).softmax(-1)
    target = (torch.randn(B, k + 1, V, generator=g) * 2).softmax(-1)
    tokens = torch.multinomial(draft.reshape(-1, V), 1, generator=g).reshape(B, k)
    return tokens, draft, target, torch.rand(B, k + 1, generator=g)


def test_nsd_theta_zero_is_sd_under_shared_uniforms():
    tokens, draft, target, u = _random_blocks(4000, 4, 6, seed=5)
    assert all(
        nsd_sample(tokens[b], draft[b], target[b], 0.0, uniforms=u[b])
        == sd_sample(tokens[b], draft[b], target[b], uniforms=u[b])
        for b in range(200)
    )
    n0, e0 = speculative_accept_batch(tokens, draft, target, u, theta=0.0)
    n_sd, e_sd = speculative_accept_batch(tokens, draft, target, u)
    assert torch.equal(n0, n_sd) and torch.equal(e0, e_sd)
    # θ → 0⁺: the nucleus is the top token only; differs from SD only where SD rejected it
    n_eps, _ = speculative_accept_batch(tokens, draft, target, u, theta=1e-9)
    assert torch.all(n_eps >= n_sd)


def test_nsd_accepted_length_non_decreasing_in_theta():
    tokens, draft, target, u = _random_blocks(4000, 5, 8, seed=6)
    lengths = [
        speculative_accept_batch(tokens, draft, target, u, theta=t)[0] for t in [i / 10 for i in range(11)]
    ]
    for a, b in zip(lengths[:-1], lengths[1:], strict=True):
        assert torch.all(b >= a)
    assert lengths[-1].float().mean() > lengths[0].float().mean()
    assert torch.all(lengths[-1] == 5)  # θ = 1: the nucleus is the support, every draft token passes


def _nsd_one_step_analytic(p: torch.Tensor, q: torch.Tensor, theta: float) -> torch.Tensor:
    """Output distribution of one NSD step (k = 1, first token only), by enumeration over y ~ q."""
    nuc = nucleus_mask(p, theta)
    accept = torch.where(nuc, torch.ones_like(p), torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-30)))
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum()
    reject_mass = (q * (1 - accept)).sum()
    return q * accept + reject_mass * residual


def test_nsd_one_step_tv_formula_analytic():
    """TV(NSD output, p) == Σ_{x ∈ nucleus(p, θ)} max(0, q − p), by enumeration, many random pairs."""
    g = torch.Generator().manual_seed(11)
    for _ in range(200):
        V = int(torch.randint(2, 9, (), generator=g))
        p = (torch.randn(V, generator=g, dtype=torch.float64) * 2).softmax(-1)
        q = (torch.randn(V, generator=g, dtype=torch.float64) * 2).softmax(-1)
        for theta in (0.0, 0.2, 0.5, 0.9, 1.0):
            out = _nsd_one_step_analytic(p, q, theta)
            predicted = float(((q - p).clamp_min(0) * nucleus_mask(p, theta)).sum())
            assert abs(float(out.sum()) - 1) < 1e-9 and abs(tv(out, p) - predicted) < 1e-9


@pytest.mark.parametrize("theta", [0.0, 0.8, 0.95, 1.0])
def test_nsd_one_step_monte_carlo_matches_analytic(theta):
    V, N = 5, 200_000
    g = torch.Generator().manual_seed(9)
    p = (torch.randn(V, generator=g) * 1.5).softmax(-1)
    q = (torch.randn(V, generator=g) * 1.5).softmax(-1)
    out = _nsd_one_step_analytic(p, q, theta)
    predicted = float(((q - p).clamp_min(0) * nucleus_mask(p, theta)).sum())
    # Monte-Carlo through the rule: the first committed token of N one-token cycles
    tokens = torch.multinomial(q, N, replacement=True, generator=g)[:, None]  # (N, 1)
    n, extra = speculative_accept_batch(
        tokens, q.expand(N, 1, V), p.expand(N, 2, V), torch.rand(N, 2, generator=g), theta
    )
    first = torch.where(n == 1, tokens[:, 0], extra)
    freq = torch.bincount(first, minlength=V) / N
    stat, pval = chi2_pvalue(freq * N, out)
    mc_tv = tv(freq, p)
    print(
        f"NSD θ={theta}: predicted TV={predicted:.4f}  Monte-Carlo TV={mc_tv:.4f}  chi2={stat:.1f} p={pval:.3f}"
    )
    assert pval > 1e-3 and abs(mc_tv - predicted) < 0.01


def test_nsd_greedy_hand_made():
    # position 1: greedy 0 (p ≈ .51/.49 over {0, 1}); position 2: greedy 2
    z = torch.log(rows([0.51, 0.49, 1e-6, 1e-6], [0.1, 0.2, 0.7, 1e-6], [0.97, 0.01, 0.01, 0.01]))
    y = torch.tensor([1, 1])
    assert nsd_greedy(y, z, 0.0) == sd_greedy(y, z) == Accept(0, 0)
    assert nsd_greedy(y, z, 0.5) == Accept(0, 0)  # nucleus {0} at θ = .5 (.51 ≥ .5)
    assert nsd_greedy(y, z, 0.6) == Accept(1, 2)  # nucleus {0, 1}; position 2: nucleus {2} (.7 ≥ .6)
    assert nsd_greedy(y, z, 0.8) == Accept(2, 0)  # position 2: {2, 1} (.7 + .2 ≥ .8); bonus 0
    assert nsd_greedy(torch.tensor([1, 3]), z, 0.999) == Accept(1, 2)  # 3 ∉ nucleus (p ≈ 0)


def test_nsd_greedy_theta_zero_is_greedy_sd_on_random_logits():
    g = torch.Generator().manual_seed(8)
    for _ in range(300):
        z = torch.randn(6, 10, generator=g)
        y = torch.where(
            torch.rand(5, generator=g) < 0.6, z[:5].argmax(-1), torch.randint(0, 10, (5,), generator=g)
        )
        assert nsd_greedy(y, z, 0.0) == sd_greedy(y, z)
        assert nsd_greedy(y, z, 0.5).n >= sd_greedy(y, z).n


# ------------------------------------------------------------------------------------------------
# ASD
# ------------------------------------------------------------------------------------------------


def test_asd_hand_made():
    V = 6
    # greedy tokens 0,0,0,0,0 (+ bonus 5); regret of token 1 at every position = 1.0
    z = torch.zeros(6, V)
    z[:, 0] = 1.0
    z[5] = torch.tensor([0, 0, 0, 0, 0, 3.0])
    s0 = AsdState()
    # all greedy: bonus, nothing spent
    assert asd_greedy(torch.tensor([0, 0, 0, 0, 0]), z, s0) == (Accept(5, 5), AsdState(0.0))
    # a mismatch at i=1 (r = 1 ≤ g·(K−i+1) = .25·5): accepted
    assert asd_greedy(torch.tensor([1, 0, 0, 0, 0]), z, s0) == (Accept(5, 5), AsdState(1.0))
    # at i = 2 of K = 5: r/v = 1/4 = g: accepted (the reference's suffix value v_i = K − i + 1)
    assert asd_greedy(torch.tensor([0, 1, 0, 0, 0]), z, s0) == (Accept(5, 5), AsdState(1.0))
    # at i = 3: .25·3 = .75 < 1: refused → correction 0
    assert asd_greedy(torch.tensor([0, 0, 1, 0, 0]), z, s0) == (Accept(2, 0), s0)
    # m = 2: a third mismatch is refused even with budget left (bigger gate)
    acc, st = asd_greedy(torch.tensor([1, 1, 1, 0, 0]), z, s0, gate=10.0)
    assert acc == Accept(2, 0) and st == AsdState(2.0)
    # the budget: 7.5 spent, r = 1 would exceed B = 8
    assert asd_greedy(torch.tensor([1, 0, 0, 0, 0]), z, AsdState(7.5)) == (Accept(0, 0), AsdState(7.5))
    # the last slot (i = K, v = 1): r = 1 > g = .25 → refused, correction 0; r = 1 ≤ g = 1 → accepted
    assert asd_greedy(torch.tensor([0, 0, 0, 0, 1]), z, s0) == (Accept(4, 0), s0)
    assert asd_greedy(torch.tensor([0, 0, 0, 0, 1]), z, s0, gate=1.0) == (Accept(5, 5), AsdState(1.0))
    z_tie = z.clone()
    z_tie[4, 1] = 1.0  # token 1 ties the greedy token 0 at the last slot: r = 0
    assert asd_greedy(torch.tensor([0, 0, 0, 0, 1]), z_tie, s0) == (Accept(5, 5), s0)
    # block_size larger than k (a short block): the gate uses K
    assert asd_greedy(torch.tensor([0, 1]), z[:3], s0, block_size=8) == (Accept(2, 0), AsdState(1.0))


def test_asd_gate_matches_the_reference_suffix_value():
    """The ASD reference's gate divides the regret at 1-based i by v_i = K − i + 1 (hand-computed cases)."""
    # a one-token block (K = 1, v_1 = 1) with regret 0.2, g = 1, B = 0.3: accepted, 0.2 spent
    z = torch.tensor([[1.0, 0.8, 0.0], [0.0, 0.0, 5.0]])
    acc, st = asd_greedy(torch.tensor([1]), z, AsdState(), budget=0.3, gate=1.0, max_mismatches=2)
    assert acc == Accept(1, 2) and st.spent == pytest.approx(0.2)
    # the same with g = 0.1: 0.2 / 1 > 0.1, refused
    acc, st = asd_greedy(torch.tensor([1]), z, AsdState(), budget=0.3, gate=0.1, max_mismatches=2)
    assert acc == Accept(0, 0) and st == AsdState()
    # a mismatch at i = 2 of K = 5 with regret 1 and g = 0.25: 1 / (5 − 2 + 1) = 0.25 ≤ g, accepted
    z5 = torch.zeros(6, 4)
    z5[:, 0] = 1.0
    acc, st = asd_greedy(
        torch.tensor([0, 1, 0, 0, 0]), z5, AsdState(), budget=8.0, gate=0.25, max_mismatches=2
    )
    assert acc == Accept(5, 0) and st == AsdState(1.0)
    # the same mismatch at i = 3 (v = 3): 1/3 > 0.25, refused
    acc, _ = asd_greedy(
        torch.tensor([0, 0, 1, 0, 0]), z5, AsdState(), budget=8.0, gate=0.25, max_mismatches=2
    )
    assert acc == Accept(2, 0)


@pytest.mark.parametrize("zero", ["budget", "gate", "max_mismatches"])
def test_asd_any_knob_zero_is_exact_greedy(zero):
    g = torch.Generator().manual_seed(9)
    kw = {"budget": 8.0, "gate": 0.25, "max_mismatches": 2, zero: 0}
    for _ in range(300):
        z = torch.randn(5, 7, generator=g)
        z[:, 1] = z[:, 0]  # ties everywhere: 1 is a zero-regret non-greedy token
        y = torch.randint(0, 3, (4,), generator=g)
        acc, st = asd_greedy(y, z, AsdState(), **kw)
        assert acc == sd_greedy(y, z) and st == AsdState()


def test_asd_properties_over_random_logits():
    """Budget never exceeded, ≤ m mismatches per block, each accepted mismatch passes the gate,
    the state carries across cycles of a request and resets for the next request."""
    g = torch.Generator().manual_seed(10)
    B, gate, m, k, V = 3.0, 0.4, 2, 6, 9
    n_mismatch_accepts = 0
    for _request in range(60):
        state = AsdState()
        assert state.spent == 0.0  # a fresh request starts with the whole budget
        for _cycle in range(8):
            z = torch.randn(k + 1, V, generator=g) * 2
            y = torch.where(
                torch.rand(k, generator=g) < 0.5, z[:k].argmax(-1), torch.randint(0, V, (k,), generator=g)
            )
            acc, new = asd_greedy(y, z, state, budget=B, gate=gate, max_mismatches=m)
            greedy = z.argmax(-1)
            regret = z[:k].max(-1).values - z[:k].gather(-1, y[:, None]).squeeze(-1)
            mism = [i for i in range(acc.n) if y[i] != greedy[i]]
            assert len(mism) <= m
            for i in mism:  # 0-based i ⇒ 1-based i+1
                assert regret[i] <= gate * (k - i)  # 0-based i: v = K − (i+1) + 1
            spent_here = float(sum(regret[i] for i in mism))
            assert new.spent == pytest.approx(state.spent + spent_here, abs=1e-5)
            assert new.spent <= B + 1e-6 and new.spent >= state.spent
            assert acc.extra == int(greedy[acc.n])  # correction / bonus is the greedy token
            if acc.n < k:  # the stop was a refusal: a mismatch that failed some condition
                i = acc.n
                assert y[i] != greedy[i]
                assert regret[i] > gate * (k - i) or len(mism) >= m or new.spent + regret[i] > B + 1e-6
            n_mismatch_accepts += len(mism)
            state = new
    assert n_mismatch_accepts > 50  # the relaxation actually triggered


def test_asd_rejects_negative_knobs():
    with pytest.raises(ValueError, match="budget"):
        asd_greedy(torch.tensor([0]), torch.zeros(2, 3), AsdState(), budget=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        asd_greedy(torch.tensor([0, 0]), torch.zeros(3, 3), AsdState(), block_size=1)


def test_rules_import_nothing_but_torch():
    import ast
    import inspect

    import prove.decode.rules.speculative as mod

    roots = set()
    for node in ast.walk(ast.parse(inspect.getsource(mod))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0] if not node.module.startswith("prove") else "prove")
    assert roots <= {"__future__", "dataclasses", "torch", "prove"}, roots
