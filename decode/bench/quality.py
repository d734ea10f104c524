"""Quality a bench row can show where task accuracy cannot move (a 135M model answers almost nothing right): each
output scored teacher-forced, untimed, after the timed rounds.

- **per-token agreement with greedy**: the share of an output's tokens that the target model's greedy choice (its
  argmax over the ids decoding allows) would have picked after the output's own prefix. AR scores 1 by definition, a
  lossless method too; a lossy method loses a point for each token its rule accepted against the target. Unlike "equal
  to AR" it does not count everything after a first divergence as lost.
- **log-likelihood relative to AR**: the mean per-token log-probability of the output under the *quality model*
  (``quality_model``, e.g. the base a proposer was trained from; else the target), minus the same for AR's output
  on the same prompt, averaged over prompts. Text the base finds less likely has lost quality; repetitive text also
  scores as likely, so the output length and distinct-n stand beside it.
- **distinct-n**: unique n-grams over all n-grams of a row's outputs (n = 1, 2), the usual diversity measure.

:func:`quality_summary` and :func:`distinct_n` are pure (lists in, numbers out); :func:`score_output` is the one
forward pass per model and output.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DISTINCT_N = (1, 2)


@dataclass(frozen=True)
class TokenScores:
    """One output, scored: per token, its log-probability under the quality model and whether the target's greedy
    choice at that position is the token."""

    logprobs: list[float]
    greedy: list[bool]


def distinct_n(outputs: Sequence[Sequence[int]], n: int) -> float | None:
    """Unique n-grams / all n-grams over every output (an n-gram never spans two outputs); None with no n-gram."""
    if n < 1:
        raise ValueError(f"distinct-n needs n ≥ 1, got {n}")
    grams = [tuple(out[i : i + n]) for out in outputs for i in range(len(out) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def quality_summary(
    scores: Sequence[TokenScores],
    reference: Sequence[TokenScores],
    outputs: Sequence[Sequence[int]],
) -> dict[str, Any]:
    """A row's quality against AR's on the same prompts (same order): ``token_agreement`` (Σ greedy matches / Σ
    tokens), ``loglik`` (mean over prompts of the output's mean per-token log-probability), ``loglik_vs_ar`` (mean
    over prompts of that minus AR's, on prompts where both produced a token), ``mean_length`` and ``distinct`` (n →
    distinct-n)."""
    if len(scores) != len(reference) or len(scores) != len(outputs):
        raise ValueError(
            f"{len(scores)} scored outputs, {len(reference)} reference ones and {len(outputs)} outputs: give all "
            "three the same prompts"
        )
    tokens = sum(len(s.greedy) for s in scores)
    per_prompt = [statistics.fmean(s.logprobs) if s.logprobs else None for s in scores]
    ref_prompt = [statistics.fmean(s.logprobs) if s.logprobs else None for s in reference]
    deltas = [a - b for a, b in zip(per_prompt, ref_prompt, strict=True) if a is not None and b is not None]
    return {
        "token_agreement": sum(sum(s.greedy) for s in scores) / tokens if tokens else None,
        "loglik": _mean([v for v in per_prompt if v is not None]),
        "loglik_vs_ar": _mean(deltas),
        "mean_length": _mean([len(o) for o in outputs]),
        "distinct": {str(n): distinct_n(outputs, n) for n in DISTINCT_N},
    }


def score_output(
    target: Any,
    scorer: Any,
    prompt: Sequence[int],
    output: Sequence[int],
    allowed: Any = None,
) -> TokenScores:
    """``output`` after ``prompt``, teacher-forced: one pass of ``target`` (its argmax over ``allowed``, a boolean
    ``(V,)`` mask or None, against each output token) and one of ``scorer`` (the log-probability of each output
    token; the same pass when ``scorer is target``)."""
    import torch

    if not output:
        return TokenScores([], [])
    ids = torch.tensor([[*prompt, *output]], device=target.device)
    start = len(prompt) - 1  # the logits at position i predict token i + 1
    with torch.no_grad():
        logits = target(input_ids=ids).logits[0, start:-1].float()  # (n, V)
        nxt = ids[0, len(prompt) :]  # (n,)
        greedy_logits = logits
        if allowed is not None:
            v = min(logits.shape[-1], allowed.shape[0])
            greedy_logits = logits[:, :v].masked_fill(~allowed[:v].to(logits.device), -math.inf)
        greedy = (greedy_logits.argmax(-1) == nxt).tolist()
        if scorer is not target:
            logits = scorer(input_ids=ids.to(scorer.device)).logits[0, start:-1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, nxt.to(logits.device)[:, None])[:, 0]
    return TokenScores([float(x) for x in logprobs.tolist()], [bool(g) for g in greedy])
