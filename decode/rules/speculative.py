"""Acceptance rules of the speculative-decoding family: SD, Nucleus SD, Approximate SD (docs/design.md §3).

Pure tensor functions: no model calls, nothing imported but torch. Notation, kept explicit because the
papers disagree on letters:

- ``target_probs`` / ``target_logits``: the verifier (big model) — *p* in the SD papers;
- ``draft_probs``: the proposer — *q* in the SD papers.

Shapes for one request's block of k proposed tokens::

    tokens        (k,)        y_1..y_k
    draft_probs   (k, V)      q(· | prefix, y_<i)
    target_probs  (k+1, V)    p(· | prefix, y_<i); the last row is the bonus position
    target_logits (k+1, V)

The batched cores (``speculative_accept_batch``) take any number of leading batch dimensions, so
Monte-Carlo tests draw 10^5 cycles in one call; the per-request wrappers return an ``Accept``.

Randomness: sampling rules consume k+1 uniforms in [0, 1) — u_1..u_k for the accept tests and
u_{k+1} for the one correction/bonus draw (inverse CDF). Pass them (``uniforms=``) to share random
numbers between rules, or a ``torch.Generator`` to have them drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from prove.decode.rules.base import Accept
from prove.decode.rules.block import greedy_match, leading_true

__all__ = [
    "AsdState",
    "asd_greedy",
    "nsd_greedy",
    "nsd_sample",
    "nucleus_mask",
    "sample_from_probs",
    "sd_greedy",
    "sd_sample",
    "speculative_accept_batch",
    "warp_probs",
]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def nucleus_mask(probs: torch.Tensor, theta: float) -> torch.Tensor:
    """The top-p nucleus of ``probs`` at threshold ``theta`` as a bool mask of the same shape.

    The nucleus is the smallest set of most probable tokens whose mass reaches ``theta``, *including*
    the token whose mass crosses it (Holtzman et al. 2020). A token is in it iff the mass strictly
    above it in the sorted order is < ``theta``. Consequences: ``theta = 0`` gives the empty set,
    any ``theta > 0`` contains the top token, ``theta >= 1`` gives the support. Zero-probability
    tokens are never in it. Ties are broken by index (stable sort), like ``argmax``.
    """
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # (..., V)
    mass_before = sorted_p.cumsum(-1) - sorted_p  # (..., V) mass strictly above each sorted token
    keep_sorted = (mass_before < theta) & (sorted_p > 0)
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def warp_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """Sampling distribution from ``logits`` (..., V): temperature, then top-k, then top-p.

    The order and semantics follow transformers' logits warpers (``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``, ``TopPLogitsWarper``): top-k keeps the k largest logits (``0`` = off),
    top-p keeps the nucleus of the tempered, top-k-filtered distribution (``nucleus_mask``; ``1.0``
    = off). ``temperature = 0`` returns the one-hot greedy distribution. Speculative sampling must
    warp draft and target alike: it then preserves the *warped* target distribution.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        probs = probs * nucleus_mask(probs, top_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from (unnormalised, non-negative) ``probs`` (..., V) with uniforms ``u`` (...).

    Deterministic in ``u``, so two rules given the same uniforms draw the same token from the same
    distribution. Never returns a zero-mass token.
    """
    cdf = probs.cumsum(-1)  # (..., V)
    v = (u * cdf[..., -1]).unsqueeze(-1)  # (..., 1)
    idx = torch.searchsorted(cdf.contiguous(), v.contiguous(), right=True).squeeze(-1)  # (...)
    # u * total can round up to total: clamp to the last token with positive mass.
    V = probs.shape[-1]
    last_pos = V - 1 - (probs > 0).flip(-1).long().argmax(-1)  # (...)
    return torch.minimum(idx, last_pos)


def _draw_uniforms(
    k: int, uniforms: torch.Tensor | None, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """k+1 uniforms on ``device`` (the block's). They are drawn on the generator's own device (a CUDA
    generator cannot fill a CPU tensor, nor the reverse), never on torch's default device."""
    if uniforms is None:
        where = generator.device if generator is not None else device
        return torch.rand(k + 1, generator=generator, device=where).to(device)
    if uniforms.shape[-1] != k + 1:
        raise ValueError(f"need k+1 = {k + 1} uniforms (k accept tests + 1 draw), got {uniforms.shape[-1]}")
    return uniforms


def _check_shapes(tokens: torch.Tensor, target: torch.Tensor, draft: torch.Tensor | None = None) -> None:
    k = tokens.shape[-1]
    assert target.shape[-2] == k + 1, f"target rows {target.shape[-2]} != k+1 = {k + 1}"
    if draft is not None:
        assert draft.shape[-2] == k, f"draft rows {draft.shape[-2]} != k = {k}"
        assert draft.shape[-1] == target.shape[-1], "draft and target vocabularies differ"


# --------------------------------------------------------------------------------------------------
# sampling: SD and NSD
# --------------------------------------------------------------------------------------------------


def speculative_accept_batch(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    theta: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2), batched.

    Shapes: tokens (..., k), draft_probs (..., k, V), target_probs (..., k+1, V), uniforms (..., k+1).
    Returns ``(n, extra)``, both (...): the accepted-prefix length and the correction/bonus token.

    Scanning i = 1..k, y_i is accepted iff u_i · q_i(y_i) < p_i(y_i), i.e. with probability
    min(1, p_i(y_i)/q_i(y_i)); with ``theta > 0`` also iff y_i lies in the top-p nucleus of p_i at
    threshold θ (Nucleus Speculative Decoding, Li et al. 2026; see ``nucleus_mask``). At the first
    rejection i the correction is drawn with u_{k+1} from norm(max(0, p_i − q_i)); if all k are
    accepted the bonus is drawn from p_{k+1}. ``theta = 0`` is exact SD, which preserves the target
    distribution; NSD's one-step total-variation error is Σ_{x∈nucleus} max(0, q(x) − p(x)).
    """
    _check_shapes(tokens, target_probs, draft_probs)
    k = tokens.shape[-1]
    idx = tokens.unsqueeze(-1)  # (..., k, 1)
    p_y = target_probs[..., :k, :].gather(-1, idx).squeeze(-1)  # (..., k)
    q_y = draft_probs.gather(-1, idx).squeeze(-1)  # (..., k)
    ok = uniforms[..., :k] * q_y < p_y  # (..., k)
    if theta > 0:
        ok = ok | nucleus_mask(target_probs[..., :k, :], theta).gather(-1, idx).squeeze(-1)
    n = leading_true(ok)  # (...)

    # correction from norm(max(0, p_n − q_n)) or bonus from p_{k+1} (q_{k+1} := 0)
    q_bonus = draft_probs.new_zeros((*draft_probs.shape[:-2], 1, draft_probs.shape[-1]))  # (..., 1, V)
    q_pad = torch.cat([draft_probs, q_bonus], dim=-2)  # (..., k+1, V)
    row = n[..., None, None].expand(*n.shape, 1, target_probs.shape[-1])  # (..., 1, V)
    p_row = target_probs.gather(-2, row).squeeze(-2)  # (..., V)
    q_row = q_pad.gather(-2, row).squeeze(-2)  # (..., V)
    residual = (p_row - q_row).clamp_min(0)  # (..., V)
    # a rejection implies q > p somewhere, hence residual mass > 0; guard rounding anyway
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_row)
    extra = sample_from_probs(residual, uniforms[..., k])
    return n, extra


def sd_sample(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> Accept:
    """Speculative sampling for one block (Leviathan et al. 2023; Chen et al. 2023).

    ``draft_probs`` (k, V) and ``target_probs`` (k+1, V) are the already-warped distributions
    (``warp_probs`` with the same temperature/top-p/top-k for both). Preserves the target's
    distribution exactly. See ``speculative_accept_batch``.
    """
    u = _draw_uniforms(tokens.shape[-1], uniforms, generator, target_probs.device)
    n, extra = speculative_accept_batch(tokens, draft_probs, target_probs, u)
    return Accept(int(n), int(extra))


def nsd_sample(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    theta: float,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> Accept:
    """Nucleus Speculative Decoding, sampling variant (Li et al. 2026).

    Accepts y_i if the SD test accepts it OR y_i lies in the top-p nucleus (threshold ``theta``) of
    the target distribution ``target_probs`` as passed (i.e. after the same warping SD uses); on
    rejection draws from SD's residual norm(max(0, p − q)). ``theta = 0`` (empty nucleus) is exactly
    ``sd_sample`` under the same uniforms. Not lossless: the one-step total-variation distance from
    the target is Σ_{x∈nucleus} max(0, q(x) − p(x)), the draft's excess mass inside the nucleus.
    """
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"nsd theta must be in [0, 1] (0 = exact SD), got {theta}")
    u = _draw_uniforms(tokens.shape[-1], uniforms, generator, target_probs.device)
    n, extra = speculative_accept_batch(tokens, draft_probs, target_probs, u, theta=theta)
    return Accept(int(n), int(extra))


# --------------------------------------------------------------------------------------------------
# greedy: SD, NSD, ASD
# --------------------------------------------------------------------------------------------------


sd_greedy = greedy_match
"""Greedy speculative decoding (Leviathan et al. 2023, §2.3 at temperature → 0): the prefix equal to the
target's greedy tokens, then the greedy correction or bonus token. One implementation, shared with
ProVe-lossless: ``prove.decode.rules.block.greedy_match``."""


def nsd_greedy(tokens: torch.Tensor, target_logits: torch.Tensor, theta: float) -> Accept:
    """Nucleus Speculative Decoding, greedy variant (Li et al. 2026).

    Accepts y_i if it is the target's greedy token OR lies in the top-p nucleus (threshold ``theta``)
    of softmax(target_logits_i) **at temperature 1** — the target's own, unwarped distribution —
    then appends the greedy correction (first rejection) or bonus token. ``theta = 0`` is exactly
    ``sd_greedy``.
    """
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"nsd theta must be in [0, 1] (0 = exact greedy SD), got {theta}")
    _check_shapes(tokens, target_logits)
    k = tokens.shape[-1]
    greedy = target_logits.argmax(-1)  # (k+1,)
    ok = tokens == greedy[:k]  # (k,)
    if theta > 0:
        probs = target_logits[:k].float().softmax(-1)  # (k, V)
        ok = ok | nucleus_mask(probs, theta).gather(-1, tokens[:, None]).squeeze(-1)
    n = int(leading_true(ok))
    return Accept(n, int(greedy[n]))


@dataclass(frozen=True)
class AsdState:
    """Request-level state of Approximate SD: the regret spent so far. Start each request with
    ``AsdState()``; carry the returned state from cycle to cycle."""

    spent: float = 0.0


def asd_greedy(
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    state: AsdState,
    *,
    budget: float = 8.0,
    gate: float = 0.25,
    max_mismatches: int = 2,
    block_size: int | None = None,
) -> tuple[Accept, AsdState]:
    """Approximate Speculative Decoding, greedy (Feng et al. 2026).

    With z_i = ``target_logits[i]`` and regret r_i = max z_i − z_i[y_i] (0 when y_i is the greedy
    token), scan i = 1..k: a greedy y_i is accepted; a mismatch is accepted iff all of

    - the gate r_i / v_i ≤ g, with v_i = K − i + 1 the number of block slots from i to the end
      (K = ``block_size``, default k; i 1-based), as in the ASD reference code (``K − i`` there, with
      0-based i). Evaluated as r_i ≤ g · v_i; the last slot (v_K = 1) accepts a mismatch of regret ≤ g;
    - fewer than m = ``max_mismatches`` mismatches already accepted in this block;
    - ``state.spent`` + r_i ≤ B = ``budget`` (B is per request: it persists across cycles through
      the returned state and resets when a new request starts from ``AsdState()``).

    At the first refusal the greedy token is appended (correction); if all k pass, the greedy bonus.
    Any of B, g, m equal to 0 gives exactly greedy decoding (no mismatch is ever accepted, ties
    included). Returns the verdict and the updated state.
    """
    if budget < 0 or gate < 0 or max_mismatches < 0:
        raise ValueError(
            f"asd needs budget >= 0, gate >= 0, max_mismatches >= 0 (0 = exact greedy); "
            f"got budget={budget}, gate={gate}, max_mismatches={max_mismatches}"
        )
    _check_shapes(tokens, target_logits)
    k = tokens.shape[-1]
    K = k if block_size is None else block_size
    if K < k:
        raise ValueError(f"asd block_size ({K}) must be >= the number of proposed tokens ({k})")
    z = target_logits[:k].float()  # (k, V)
    greedy = target_logits.argmax(-1)  # (k+1,)
    regret = (z.max(-1).values - z.gather(-1, tokens[:, None]).squeeze(-1)).tolist()  # (k,)
    relaxed = budget > 0 and gate > 0 and max_mismatches > 0
    spent, used, n = state.spent, 0, 0
    for i in range(1, k + 1):
        y, r = int(tokens[i - 1]), regret[i - 1]
        if y == int(greedy[i - 1]):
            n = i
            continue
        if relaxed and r <= gate * (K - i + 1) and used < max_mismatches and spent + r <= budget:
            spent, used, n = spent + r, used + 1, i
            continue
        break
    return Accept(n, int(greedy[n])), AsdState(spent)
