"""prove-bench, the pure numbers on hand-made data: divergence, ROC/AUC, per-depth rates, aggregation, paired speedups."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from prove.decode.bench.metrics import (
    PromptRun,
    auc,
    first_divergence,
    rate_by_depth,
    roc_curve,
    roc_table,
    summarize,
    tokens_per_cycle_by_position,
    trace_points,
)


@pytest.mark.parametrize(
    ("out", "ref", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([1, 2, 9, 4], [1, 2, 3, 4], 2),
        ([5], [1], 0),
        ([1, 2], [1, 2, 3], 2),  # stopped early: diverges where the shorter one ends
        ([1, 2, 3], [1, 2], 2),
        ([], [7], 0),
    ],
)
def test_first_divergence(out, ref, expected):
    assert first_divergence(out, ref) == expected


def mann_whitney(scores, labels) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie), by brute force."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_roc_perfect_reversed_and_uninformative():
    labels = [True, True, False, False]
    fpr, tpr, thr = roc_curve([0.9, 0.8, 0.3, 0.1], labels)
    assert auc(fpr, tpr) == 1.0
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1)
    assert thr[0] == np.inf and list(thr[1:]) == [0.9, 0.8, 0.3, 0.1]
    fpr, tpr, _ = roc_curve([0.1, 0.2, 0.8, 0.9], labels)
    assert auc(fpr, tpr) == 0.0
    fpr, tpr, _ = roc_curve([0.5] * 4, labels)  # one tie group: a single diagonal step
    assert fpr.tolist() == [0, 1] and tpr.tolist() == [0, 1]
    assert auc(fpr, tpr) == 0.5


def test_roc_hand_example():
    # thresholds 0.9, 0.7, 0.4 (a tie of one positive and one negative), 0.2
    fpr, tpr, thr = roc_curve([0.9, 0.7, 0.4, 0.4, 0.2], [True, False, True, False, True])
    assert thr[1:].tolist() == [0.9, 0.7, 0.4, 0.2]
    assert tpr.tolist() == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 1])
    assert fpr.tolist() == pytest.approx([0, 0, 0.5, 1, 1])
    assert auc(fpr, tpr) == pytest.approx(mann_whitney([0.9, 0.7, 0.4, 0.4, 0.2], [1, 0, 1, 0, 1]))


def test_auc_equals_mann_whitney_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.integers(0, 6, size=40) / 5  # many ties
        labels = rng.random(40) < 0.4 + 0.1 * scores
        labels[0], labels[1] = True, False
        fpr, tpr, _ = roc_curve(scores.tolist(), labels.tolist())
        assert auc(fpr, tpr) == pytest.approx(mann_whitney(scores.tolist(), labels.tolist()))
        assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def test_roc_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        roc_curve([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="same length"):
        roc_curve([0.1, 0.2], [True])


def test_rate_by_depth_ragged():
    hits = [[3, 2, 0], [1], []]
    totals = [[3, 3, 3], [1], []]
    assert rate_by_depth(hits, totals) == [1.0, 2 / 3, 0.0]
    assert rate_by_depth([], []) == []
    with pytest.raises(ValueError, match="different lengths"):
        rate_by_depth([[1, 0]], [[1]])


def test_tokens_per_cycle_by_position():
    # request 1: cycles start at 0 (1 token), 1 (3), 4 (4); request 2: at 0 (2), 2 (2)
    starts, means, counts = tokens_per_cycle_by_position([[1, 3, 4], [2, 2]], bin_size=4)
    assert starts == [0, 4]
    assert means == [2.0, 4.0]
    assert counts == [4, 1]
    with pytest.raises(ValueError):
        tokens_per_cycle_by_position([[1]], bin_size=0)


def run(tokens, wall, cycles, passes, text="", **kw) -> PromptRun:
    return PromptRun(
        id=None, token_ids=tokens, text=text, wall_s=wall, cycles=cycles, model_passes=passes, **kw
    )


def test_summarize_hand_numbers():
    ar = [run([1, 2, 3, 4], 4.0, 4, 4, "The answer is 4."), run([5, 6], 2.0, 2, 2, "The answer is 7.")]
    fast = [
        run([1, 2, 3, 4], 1.0, 2, 2, "The answer is 4.", verifier_passes=2, committed_per_cycle=[3, 1]),
        run([5, 9], 2.0, 1, 1, "The answer is 9.", verifier_passes=1, committed_per_cycle=[2]),
    ]
    s = summarize(fast, ar, ["4", "9"])
    assert s["tokens_per_cycle"] == 2.0  # 6 tokens / 3 cycles
    assert s["model_passes_per_token"] == 0.5 and s["verifier_passes_per_token"] == 0.5
    assert s["draft_passes_per_token"] == 0
    assert s["speedup_median"] == pytest.approx((4.0 + 1.0) / 2)  # per-prompt tokens/s ratios 4× and 1×
    assert s["speedup_total"] == pytest.approx((6 / 3.0) / (6 / 6.0))
    assert s["first_divergence"] == [None, 1]  # the agreement column sees the divergence
    assert s["agreement"] == 0.5 and s["mean_first_divergence"] == 1
    assert s["accuracy"] == 1.0  # scored with prove.data.synthetic.score
    assert s["tokens_per_cycle_by_position"]["mean"] == [2.0]
    assert s["engine_ms_per_cycle"] is None  # runs that did not time their passes (transformers' rows)
    timed = [dataclasses.replace(fast[0], model_s=0.7), dataclasses.replace(fast[1], model_s=1.9)]
    # (1.0 − 0.7) + (2.0 − 1.9) = 0.4 s outside passes over 3 cycles: per cycle, not per prompt or token
    assert summarize(timed, ar)["engine_ms_per_cycle"] == pytest.approx(400 / 3)
    same = summarize(ar, ar, [None, None])
    assert same["agreement"] == 1.0 and same["speedup_total"] == 1.0 and same["accuracy"] is None
    custom = summarize(fast, ar, ["x", "y"], scorer=lambda text, answer: answer == "x")
    assert custom["accuracy"] == 0.5


def test_summarize_rejects_mismatched_prompts():
    with pytest.raises(ValueError, match="same prompts"):
        summarize([run([1], 1.0, 1, 1)], [])


def test_trace_points_and_roc_table():
    rows = [
        {"conf": [0.9, 0.8, 0.2], "verifier_prob": [0.9, 0.1, 0.3], "matched": [True, True, False]},
        {"conf": [0.7, 0.1], "verifier_prob": [0.6, 0.5], "matched": [True, False]},
        {"conf": [0.5], "verifier_prob": None, "matched": None},  # no target scores: skipped
    ]
    pts = trace_points([rows, None])
    assert pts["depth"] == [0, 1, 2, 0, 1]
    assert pts["matched"] == [True, True, False, True, False]
    roc = roc_table(pts)
    assert set(roc) == {"p_tilde", "q", "p_tilde_q"}
    assert roc["p_tilde"]["auc"] == 1.0
    assert roc["q"]["auc"] == pytest.approx(mann_whitney([0.9, 0.1, 0.3, 0.6, 0.5], pts["matched"]))
    no_q = trace_points([[{"conf": [0.9, 0.1], "verifier_prob": None, "matched": [True, False]}]])
    assert set(roc_table(no_q)) == {"p_tilde"}
    assert roc_table(trace_points([[{"conf": [0.9], "matched": [True]}]])) == {}  # one class: no curve


def test_paired_speedup():
    from prove.decode.bench.metrics import PromptRun, paired_speedup

    ours = [PromptRun(0, [1, 2], "", 1.0, 1, 1), PromptRun(1, [3], "", 2.0, 1, 1)]
    theirs = [PromptRun(0, [1, 2], "", 1.5, 2, 2), PromptRun(1, [3], "", 2.0, 1, 1)]
    got = paired_speedup(ours, theirs)
    assert got["per_prompt"] == [1.5, 1.0] and got["median"] == 1.25 and got["total"] == 3.5 / 3.0
    assert got["identical"]
    assert not paired_speedup(ours, [theirs[0], PromptRun(1, [4], "", 2.0, 1, 1)])["identical"]
