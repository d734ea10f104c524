"""Monte-Carlo through the real Decoder: sampling SD and NSD (and AR) commit tokens from the exact warped
distribution, with temperature < 1, top-k and top-p on, and a draft that is partly accepted.

The models are toy bigram LMs (``decode_helpers.BigramLM``): the engine, the proposers, the caches, the
rule adapters and the rules run as in production, while the exact distribution of the first tokens is a
table lookup. The rule-level tests (``test_rules_speculative``) check the rules alone on 10^5 cycles; these
check that the engine feeds them the right, warped distributions (the draft's and the target's alike). ``fast``:
the same through the fast path (``prove.decode.engine.device``: slot caches, the cycle's draws from a device buffer of
uniforms, the rule's sync-free twin); its prompt has a token before ``PROMPT`` (its draft re-reads the last two),
which a bigram ignores."""

from __future__ import annotations

import pytest
import torch
from prove.decode import Decoder
from prove.decode.rules.speculative import nucleus_mask, warp_probs

from tests.decode.decode_helpers import BigramLM

pytestmark = pytest.mark.slow  # ~1 min on a busy 2-core CPU: thousands of short decodes

V, PROMPT, N = 12, [3], 1500
WARP = {"temperature": 0.6, "top_k": 5, "top_p": 0.9}


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson χ² p-value over cells with positive probability; a sample in a zero cell fails outright."""
    pos = probs > 0
    assert counts[~pos].sum() == 0, f"samples where the exact distribution is 0: {counts[~pos].tolist()}"
    exp = counts.sum() * probs[pos].double()
    stat = ((counts[pos].double() - exp) ** 2 / exp).sum()
    df = int(pos.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


@pytest.fixture(scope="module")
def tables():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(V, V, generator=g) * 0.7  # after warping, 3–5 tokens per row keep mass
    draft = target + torch.randn(V, V, generator=g) * 0.5  # partly right: some drafts accepted, some not
    return target, draft


def warped(logits: torch.Tensor) -> torch.Tensor:
    return warp_probs(logits, WARP["temperature"], top_p=WARP["top_p"], top_k=WARP["top_k"])


def first_tokens(dec: Decoder, n_tokens: int, prompt: list[int] = PROMPT) -> torch.Tensor:
    rows = []
    for s in range(N):
        out = dec.generate(prompt, max_new_tokens=3, eos_token_id=[], seed=s)
        assert (out.stats.fast is not None) == (dec.fast_engine is not None), "the fast path did not run"
        rows.append(out.token_ids[:n_tokens])
    return torch.tensor(rows)  # (N, n_tokens)


def fast_kw(fast: bool) -> dict:
    return {"fast": True, "cache_len": 16} if fast else {"fast": False}


def counts(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V)


@pytest.mark.parametrize(("cut", "fast"), [(False, False), (True, False), (False, True)])
def test_sampling_sd_commits_the_warped_target_distribution(tables, cut, fast):
    """``cut``: ``draft_threshold`` just under the draft's likeliest first token, so the draft goes on to a
    second token only after drawing that one (with its probability p), and stops after one token otherwise:
    the committed tokens keep the exact distribution, and two tokens are proposed in a share p of the cycles.
    ``fast``: fails if the fast cycle warps draft or target otherwise, tests acceptance against the wrong rows,
    reuses a uniform between the draft's draw and the rule's test (a biased acceptance), or draws the correction
    from the wrong residual."""
    T, D = tables
    q = warped(D[PROMPT[-1]])  # the draft's first-token distribution (a bigram: it depends on PROMPT only)
    threshold = float(q.max()) - 1e-6 if cut else 0.0
    prompt = [0, *PROMPT] if fast else PROMPT
    dec = Decoder(
        BigramLM(T),
        None,
        method="sd",
        draft=BigramLM(D),
        k=2,
        draft_threshold=threshold,
        **WARP,
        **fast_kw(fast),
    )
    toks = first_tokens(dec, 2, prompt)
    p1 = warped(T[PROMPT[-1]])  # (V,)
    p2 = p1 @ warped(T)  # marginal of the second token: Σ_x p(x) p(· | x)
    assert chi2_pvalue(counts(toks[:, 0]), p1) > 1e-3
    assert chi2_pvalue(counts(toks[:, 1]), p2) > 1e-3
    # the draft was partly accepted: neither always nor never
    n = 300
    stats = [dec.generate(prompt, max_new_tokens=3, eos_token_id=[], seed=s).stats for s in range(n)]
    acc = sum(st.accepted_by_depth[0] for st in stats)
    assert 0.2 * n < acc < 0.9 * n
    # cycles whose proposal held two tokens (only the first cycle can: later ones have a budget of one)
    two = sum(st.proposed_by_depth[1] if len(st.proposed_by_depth) > 1 else 0 for st in stats)
    p = float(q.max()) if cut else 1.0
    assert 0.2 < p < 0.8 or not cut  # the cut splits the cycles
    assert abs(two - n * p) <= 4 * (n * p * (1 - p)) ** 0.5, (two, n * p)


def test_sampling_nsd_commits_its_exact_one_step_distribution(tables):
    """NSD's first token: q·a + (1 − Σ q·a)·norm(max(0, p − q)), a = 1 inside the nucleus of the warped target
    at θ, else min(1, p/q) — with p and q the warped target and draft distributions."""
    T, D = tables
    theta, prompt = 0.7, [6]  # a row where the draft over-weights a nucleus token: NSD ≠ the target
    dec = Decoder(BigramLM(T), None, method="nsd", draft=BigramLM(D), k=2, theta=theta, **WARP)
    toks = first_tokens(dec, 1, prompt)
    p, q = warped(T[prompt[-1]]), warped(D[prompt[-1]])
    a = torch.where(nucleus_mask(p, theta), torch.ones_like(p), (p / q.clamp_min(1e-30)).clamp(max=1.0))
    residual = (p - q).clamp_min(0)
    exact = q * a + (1 - (q * a).sum()) * residual / residual.sum()
    assert exact.sum() == pytest.approx(1.0, abs=1e-5)
    assert (exact - p).abs().sum() > 0.4  # NSD is not the target here: the test tells the two apart
    assert chi2_pvalue(counts(toks[:, 0]), exact) > 1e-3


@pytest.mark.parametrize("fast", [False, True])
def test_ar_sampling_draws_the_warped_target(tables, fast):
    """Fails if AR's draw (the reference's multinomial, the fast path's inverse CDF of a device uniform) is taken
    from another warping or another row than the target's next-token distribution."""
    T, _ = tables
    dec = Decoder(BigramLM(T), None, method="ar", **WARP, **fast_kw(fast))
    toks = first_tokens(dec, 2, [0, *PROMPT] if fast else PROMPT)
    p1 = warped(T[PROMPT[-1]])
    assert chi2_pvalue(counts(toks[:, 0]), p1) > 1e-3
    assert chi2_pvalue(counts(toks[:, 1]), p1 @ warped(T)) > 1e-3
