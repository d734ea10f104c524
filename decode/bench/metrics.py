"""The bench's numbers, pure (lists in, numbers out; unit-tested on hand-made data): agreement with AR
(:func:`first_divergence`), per-row summaries over the prompts (:func:`summarize`), paired speedups, the
per-depth acceptance curve and the ROC / AUC of the "matches greedy" predictors."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike


def first_divergence(output: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where ``output`` and ``reference`` differ; ``None`` if they are identical.

    If one is a strict prefix of the other (one stopped earlier) they diverge at the shorter length.
    """
    for i, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return i
    if len(output) != len(reference):
        return min(len(output), len(reference))
    return None


def roc_curve(scores: Sequence[float], labels: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC of ``scores`` as a predictor of ``labels`` (True = positive): ``(fpr, tpr, thresholds)``.

    One point per distinct score, from the highest threshold down ("predict positive iff score ≥ t"),
    starting at (0, 0) with threshold +inf and ending at (1, 1). Needs at least one positive and one
    negative label.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be 1-D and of the same length")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"an ROC curve needs both classes; got {n_pos} positives and {n_neg} negatives")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last_of_group = np.r_[
        np.nonzero(np.diff(s))[0], s.size - 1
    ]  # index of the last element of each tie group
    tps = np.cumsum(y)[last_of_group]
    fps = np.cumsum(~y)[last_of_group]
    tpr = np.r_[0.0, tps / n_pos]
    fpr = np.r_[0.0, fps / n_neg]
    thresholds = np.r_[np.inf, s[last_of_group]]
    return fpr, tpr, thresholds


def auc(fpr: ArrayLike, tpr: ArrayLike) -> float:
    """Area under a curve by the trapezoid rule (for an ROC curve: P(score⁺ > score⁻) + ½ P(tie))."""
    x, y = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def rate_by_depth(hits: Iterable[Sequence[int]], totals: Iterable[Sequence[int]]) -> list[float]:
    """Σ hits[i] / Σ totals[i] per block position i over requests of ragged length (NaN where 0 proposed)."""
    h: list[float] = []
    t: list[float] = []
    for hit, tot in zip(hits, totals, strict=True):
        if len(hit) != len(tot):
            raise ValueError(f"per-depth counts of different lengths: {len(hit)} vs {len(tot)}")
        grow = len(tot) - len(t)
        if grow > 0:
            h += [0.0] * grow
            t += [0.0] * grow
        for i, (a, b) in enumerate(zip(hit, tot, strict=True)):
            h[i] += a
            t[i] += b
    return [a / b if b else math.nan for a, b in zip(h, t, strict=True)]


def tokens_per_cycle_by_position(
    committed_per_cycle: Iterable[Sequence[int]], bin_size: int
) -> tuple[list[int], list[float], list[int]]:
    """Mean tokens committed per cycle along the response: cycles are binned by the response position
    where they start (``bin_size`` tokens a bin). Returns ``(bin starts, means, cycles per bin)``."""
    if bin_size < 1:
        raise ValueError(f"bin_size={bin_size} must be ≥ 1")
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for request in committed_per_cycle:
        pos = 0
        for n in request:
            b = pos // bin_size
            sums[b] = sums.get(b, 0.0) + n
            counts[b] = counts.get(b, 0) + 1
            pos += n
    bins = sorted(counts)
    return [b * bin_size for b in bins], [sums[b] / counts[b] for b in bins], [counts[b] for b in bins]


def _per_token(n: int, tokens: int) -> float:
    return n / tokens if tokens else math.nan


def _engine_ms_per_cycle(runs: Sequence[PromptRun]) -> float | None:
    """Milliseconds a cycle spends outside model passes (Σ (wall − model time) / Σ cycles); None when a run
    did not time its passes (transformers' rows)."""
    outside = [r.wall_s - r.model_s for r in runs if r.model_s is not None]
    if len(outside) < len(runs):
        return None
    cycles = sum(r.cycles for r in runs)
    return 1000 * sum(outside) / cycles if cycles else math.nan


@dataclass(frozen=True)
class PromptRun:
    """One row's result on one prompt (the per-prompt record of bench.json)."""

    id: Any
    token_ids: list[int]
    text: str
    wall_s: float
    cycles: int
    model_passes: int
    verifier_passes: int = 0
    draft_passes: int = 0
    model_s: float | None = None
    """Of ``wall_s``, the seconds inside model passes (``Stats.model_s``); None for transformers' rows."""
    accepted_by_depth: list[int] = field(default_factory=list)
    proposed_by_depth: list[int] = field(default_factory=list)
    committed_per_cycle: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


def summarize(
    runs: Sequence[PromptRun],
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None = None,
    *,
    scorer: Callable[[str, str], bool] | None = None,
    checks: Sequence[Callable[[str], bool] | None] | None = None,
    bin_size: int = 8,
) -> dict[str, Any]:
    """The numbers of one row, from its per-prompt runs and AR's on the same prompts (same order).

    - ``tokens_per_cycle`` = Σ new tokens / Σ cycles: the mean committed length, correction / bonus
      token included (AR: 1.0).
    - ``*_passes_per_token`` = Σ passes / Σ new tokens.
    - ``speedup_median`` = median over prompts of (tokens/s of the row) / (tokens/s of AR) on that
      prompt; ``speedup_total`` = (Σ tokens / Σ time of the row) / (the same for AR). For a lossless
      method both are plain time ratios (same tokens).
    - ``engine_ms_per_cycle``: wall time outside the models' forward passes per cycle (host time: on a GPU
      it also holds waits for kernels the passes queued); None for transformers' rows.
    - ``agreement`` = share of prompts whose output equals AR's token for token; ``first_divergence``
      the position where it first differs (``None`` = identical), per prompt.
    - ``accuracy`` = share of prompts with an answer that ``scorer(text, answer)`` accepts (``None``
      when no prompt has an answer); or, given ``checks`` (one per prompt, None where a prompt is not scored: a
      named suite's), the share of the checked prompts whose ``check(text)`` holds.
    """
    if len(runs) != len(reference):
        raise ValueError(f"{len(runs)} runs but {len(reference)} reference runs: give both the same prompts")
    if not runs:
        raise ValueError("no prompts to summarize")
    tokens, cycles = sum(r.new_tokens for r in runs), sum(r.cycles for r in runs)
    tps, speedups = _speedups(runs, reference)
    divergence, diverged = _divergence(runs, reference)
    correct = _correct(runs, answers, scorer, checks)
    starts, tpc, counts = tokens_per_cycle_by_position((r.committed_per_cycle for r in runs), bin_size)
    return {
        "n_prompts": len(runs),
        "new_tokens": tokens,
        "cycles": cycles,
        "tokens_per_cycle": tokens / cycles if cycles else math.nan,
        "model_passes_per_token": _per_token(sum(r.model_passes for r in runs), tokens),
        "verifier_passes_per_token": _per_token(sum(r.verifier_passes for r in runs), tokens),
        "draft_passes_per_token": _per_token(sum(r.draft_passes for r in runs), tokens),
        "wall_s": sum(r.wall_s for r in runs),
        "engine_ms_per_cycle": _engine_ms_per_cycle(runs),
        "tokens_per_s": tps,
        **speedups,
        "agreement": 1 - len(diverged) / len(runs),
        "first_divergence": divergence,
        "mean_first_divergence": statistics.fmean(diverged) if diverged else None,
        "accuracy": statistics.fmean(correct) if correct else None,
        "acceptance_by_depth": rate_by_depth(
            (r.accepted_by_depth for r in runs), (r.proposed_by_depth for r in runs)
        ),
        "tokens_per_cycle_by_position": {
            "bin_size": bin_size,
            "start": starts,
            "mean": tpc,
            "cycles": counts,
        },
    }


def _divergence(
    runs: Sequence[PromptRun], reference: Sequence[PromptRun]
) -> tuple[list[int | None], list[int]]:
    """Per prompt, where the output first differs from the reference's (None = identical), and those that differ."""
    divergence = [first_divergence(r.token_ids, a.token_ids) for r, a in zip(runs, reference, strict=True)]
    return divergence, [d for d in divergence if d is not None]


def _speedups(runs: Sequence[PromptRun], reference: Sequence[PromptRun]) -> tuple[float, dict[str, float]]:
    """A row's tokens/s and its ``speedup_median`` / ``speedup_total`` over ``reference`` (:func:`summarize`)."""
    wall, ref_wall = sum(r.wall_s for r in runs), sum(r.wall_s for r in reference)
    tps = sum(r.new_tokens for r in runs) / wall if wall > 0 else math.nan
    ref_tps = sum(r.new_tokens for r in reference) / ref_wall if ref_wall > 0 else math.nan
    ratios = [
        (r.new_tokens / r.wall_s) / (a.new_tokens / a.wall_s)
        for r, a in zip(runs, reference, strict=True)
        if r.wall_s > 0 and a.wall_s > 0 and r.new_tokens and a.new_tokens
    ]
    return tps, {
        "speedup_median": statistics.median(ratios) if ratios else math.nan,
        "speedup_total": tps / ref_tps if ref_tps and ref_tps > 0 else math.nan,
    }


def _correct(
    runs: Sequence[PromptRun],
    answers: Sequence[str | None] | None,
    scorer: Callable[[str, str], bool] | None,
    checks: Sequence[Callable[[str], bool] | None] | None,
) -> list[bool]:
    """Per scored prompt, whether its output passes: ``checks`` (one per prompt, None = not scored), else
    ``scorer(text, answer)`` over the prompts with an answer (default scorer: ``prove.data.synthetic.score``)."""
    if checks is not None:
        if len(checks) != len(runs):
            raise ValueError(f"{len(checks)} checks for {len(runs)} prompts")
        return [bool(c(r.text)) for r, c in zip(runs, checks, strict=True) if c is not None]
    if answers is None:
        return []
    if len(answers) != len(runs):
        raise ValueError(f"{len(answers)} answers for {len(runs)} prompts")
    if scorer is None:
        from prove.data.synthetic import score

        scorer = score
    return [bool(scorer(r.text, a)) for r, a in zip(runs, answers, strict=True) if a is not None]


GROUP_KEYS = (
    "n_prompts", "new_tokens", "cycles", "tokens_per_cycle", "speedup_median", "speedup_total", "agreement",
    "accuracy", "acceptance_by_depth", "tokens_per_cycle_by_position",
)  # fmt: skip
"""What a category's entry of a row keeps of :func:`summarize`."""


def group_key(suite: str | None, category: str | None) -> str:
    """A category's name in bench.json: ``suite/category`` (``mt-bench/writing``), or the category alone."""
    return f"{suite}/{category}" if suite else str(category)


def summarize_groups(
    runs: Sequence[PromptRun],
    reference: Sequence[PromptRun],
    groups: Sequence[str | None],
    *,
    checks: Sequence[Callable[[str], bool] | None] | None = None,
    bin_size: int = 64,
) -> dict[str, dict[str, Any]]:
    """:func:`summarize` over each group's prompts (``groups[i]``: prompt i's category, None = in none), in the
    order groups first appear; tokens per cycle along the response in bins of ``bin_size`` (first 64 tokens,
    next 64, ...: a cycle counts in the bin where it starts)."""
    if not (len(runs) == len(reference) == len(groups)) or (checks is not None and len(checks) != len(runs)):
        raise ValueError(f"{len(runs)} runs, {len(reference)} reference runs and {len(groups)} groups")
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None:
            members.setdefault(g, []).append(i)
    out: dict[str, dict[str, Any]] = {}
    for g, idx in members.items():
        s = summarize(
            [runs[i] for i in idx],
            [reference[i] for i in idx],
            checks=None if checks is None else [checks[i] for i in idx],
            bin_size=bin_size,
        )
        out[g] = {k: s[k] for k in GROUP_KEYS}
    return out


def paired_speedup(ours: Sequence[PromptRun], theirs: Sequence[PromptRun]) -> dict[str, Any]:
    """How much faster ``ours`` ran than ``theirs`` on the same prompts (same order): per prompt their time over
    ours (> 1: ours is faster), its median, the ratio of total times, and whether the tokens are identical
    on every prompt (only then is a time ratio a speed ratio)."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"{len(ours)} and {len(theirs)} runs: give both rows the same, non-empty prompt set")
    ratios = [t.wall_s / o.wall_s for o, t in zip(ours, theirs, strict=True) if o.wall_s > 0 and t.wall_s > 0]
    total_ours, total_theirs = sum(o.wall_s for o in ours), sum(t.wall_s for t in theirs)
    return {
        "median": statistics.median(ratios) if ratios else math.nan,
        "total": total_theirs / total_ours if total_ours > 0 else math.nan,
        "per_prompt": ratios,
        "identical": all(o.token_ids == t.token_ids for o, t in zip(ours, theirs, strict=True)),
    }


def trace_points(traces: Iterable[Sequence[Mapping[str, Any]] | None]) -> dict[str, list[Any]]:
    """Flatten per-cycle trace rows (``Stats.trace``) into per-position columns: ``depth``, ``conf`` (p̃),
    ``q`` (verifier probability, ``None`` when no verifier scored), ``matched`` (the token equals the
    target's greedy token given the same prefix). Positions without a ``matched`` flag are skipped."""
    cols: dict[str, list[Any]] = {"depth": [], "conf": [], "q": [], "matched": []}
    for trace in traces:
        for row in trace or ():
            matched = row.get("matched")
            if matched is None:
                continue
            q = row.get("verifier_prob") or [None] * len(matched)
            for i, (c, v, m) in enumerate(zip(row["conf"], q, matched, strict=True)):
                cols["depth"].append(i)
                cols["conf"].append(float(c))
                cols["q"].append(None if v is None else float(v))
                cols["matched"].append(bool(m))
    return cols


def roc_table(points: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """ROC curve and AUC of p̃, q and p̃·q for predicting "matches greedy" (each one needs both classes;
    q and p̃·q need verifier probabilities)."""
    labels = list(points["matched"])
    conf = list(points["conf"])
    scores: dict[str, list[float]] = {"p_tilde": conf}
    if labels and all(v is not None for v in points["q"]):
        scores["q"] = list(points["q"])
        scores["p_tilde_q"] = [c * v for c, v in zip(conf, points["q"], strict=True)]
    out: dict[str, dict[str, Any]] = {}
    if len(set(labels)) < 2:
        return out
    for name, s in scores.items():
        fpr, tpr, thr = roc_curve(s, labels)
        out[name] = {
            "auc": auc(fpr, tpr),
            "fpr": fpr.tolist(),
            "tpr": tpr.tolist(),
            "thresholds": thr.tolist(),
        }
    return out


def vllm_summary(
    token_ids: Sequence[Sequence[int]],
    stats: Sequence[Mapping[str, Any]],
    texts: Sequence[str],
    wall_s: float,
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None = None,
    *,
    scorer: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """The numbers of one vLLM row (one method at one concurrency, every prompt decoded with that many requests in
    flight in ``wall_s`` seconds), from its per-request outputs and stats (``VllmStats.to_dict()``) and our AR's runs
    on the same prompts (same order).

    - ``tokens_per_s`` = Σ new tokens / ``wall_s``: the throughput of the whole batch (not a per-request speed).
    - ``mean_acceptance_length``: vLLM's own figure, 1 + Σ accepted draft tokens / Σ drafting steps, over the steps
      that drafted (``None`` without drafts). It is not our ``tokens_per_cycle``, which divides every committed
      token by every step (the prefill step's token and the bonus tokens included, no draft cut).
    - ``tokens_per_cycle`` = Σ new tokens / Σ engine steps each request took part in (AR: 1.0).
    - ``agreement``, ``first_divergence``, ``accuracy`` as in :func:`summarize`; ``acceptance_by_depth`` over the
      committed tokens.
    """
    n = len(token_ids)
    if not n or n != len(stats) or n != len(texts) or n != len(reference):
        raise ValueError(
            f"{n} outputs, {len(stats)} stats, {len(texts)} texts, {len(reference)} reference runs"
        )
    tokens = sum(len(t) for t in token_ids)
    cycles = sum(int(s["cycles"]) for s in stats)
    drafts = sum(int(s.get("drafts", 0)) for s in stats)
    accepted = sum(int(s.get("accepted_tokens", 0)) for s in stats)
    divergence = [first_divergence(t, r.token_ids) for t, r in zip(token_ids, reference, strict=True)]
    diverged = [d for d in divergence if d is not None]
    correct: list[bool] = []
    if answers is not None:
        if scorer is None:
            from prove.data.synthetic import score

            scorer = score
        correct = [bool(scorer(text, a)) for text, a in zip(texts, answers, strict=True) if a is not None]
    return {
        "n_prompts": n,
        "new_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else math.nan,
        "tokens_per_cycle": tokens / cycles if cycles else math.nan,
        "drafts": drafts,
        "accepted_tokens": accepted,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "agreement": 1 - len(diverged) / n,
        "first_divergence": divergence,
        "mean_first_divergence": statistics.fmean(diverged) if diverged else None,
        "accuracy": statistics.fmean(correct) if correct else None,
        "acceptance_by_depth": rate_by_depth(
            (s.get("accepted_by_depth", []) for s in stats), (s.get("proposed_by_depth", []) for s in stats)
        ),
    }


def crossover(
    concurrency: Sequence[int], speculative: Sequence[float], baseline: Sequence[float]
) -> dict[str, Any] | None:
    """Where speculation stops paying along a concurrency sweep: the first concurrency whose tokens/s is at or
    below the baseline's (``first_loss``), the one before it (``last_win``), and ``estimate``, the concurrency where
    the ratio crosses 1 between them by linear interpolation in log2(concurrency). ``None`` when it pays at every
    point; ``last_win`` is ``None`` when it pays at none. ``concurrency`` ascending; NaN points are skipped."""
    points = [
        (c, s / b)
        for c, s, b in zip(concurrency, speculative, baseline, strict=True)
        if b and b > 0 and not math.isnan(s) and not math.isnan(b)
    ]
    for i, (c, ratio) in enumerate(points):
        if ratio <= 1:
            if i == 0:
                return {"last_win": None, "first_loss": c, "estimate": None}
            c0, r0 = points[i - 1]
            x0, x1 = math.log2(c0), math.log2(c)
            x = x0 + (x1 - x0) * (r0 - 1) / (r0 - ratio) if r0 != ratio else x1
            return {"last_win": c0, "first_loss": c, "estimate": 2**x}
    return None
