"""What a pass-cost curve t(w) predicts: a method's speedup over AR from the cost of its cycle's passes and its tokens
per cycle — the one copy of this arithmetic (``prove.recipes.gpu_check.predict`` imports it).

prove-bench's ``predicted`` section (:func:`predicted_section`) applies it to the H200 curves measured 2026-12-04
(``h200_cost_curves.json`` beside this module, package data; docs/gpu.md "Part 4 on the H200"): for each greedy row
with per-depth acceptance, its tokens per cycle measured here over its cycle's cost on each shape. Predicted, never
measured: bench.md prints it in a table of its own.

Imports nothing beyond the standard library at import time (``fused_width`` reads the engine's tree width lazily),
so the GPU check, which has only torch and transformers, can use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CURVES_FILE = Path(__file__).with_name("h200_cost_curves.json")
"""The H200's t(w) by shape (package data)."""

KINDS = ("prove-lossless", "prove-lossless fused", "prove", "sd")
"""The cycles :func:`cycle_cost` prices."""


def interp(curve: Mapping[int, float], w: float) -> float:
    """t(w) by linear interpolation between measured widths; NaN outside them."""
    xs = sorted(curve)
    if not xs or w < xs[0] or w > xs[-1]:
        return math.nan
    for lo, hi in zip(xs, xs[1:], strict=False):
        if lo <= w <= hi:
            return curve[lo] + (curve[hi] - curve[lo]) * (w - lo) / (hi - lo)
    return curve[xs[0]]


def block_sizes_for(acceptance: Sequence[float]) -> list[int]:
    """K = 2, 4, 8, … up to the measured depth (and the measured depth itself)."""
    n = len(acceptance)
    ks = [2**i for i in range(1, 10) if 2**i <= n]
    return sorted(set(ks + ([n] if n >= 2 else [])))


def fused_width(k: int) -> int:
    """Entries of the fused pass the prediction assumes at block size K: ``fuse_groups=all`` with the second
    candidate, the widest tree ``fuse=true`` builds — the pending tokens, the K − 1 carried proposals, the second
    candidate and the group after it, and a group of K − 1 placeholders for every acceptance length: at most
    (K + 3)(K − 1) + 2 entries (79 at K = 8, 287 at K = 16), the top of the widths the Decoder itself calibrates
    ``fuse_groups=auto`` on (``prove.decode.engine.fused.cost_widths``)."""
    from prove.decode.engine.fused import cost_widths

    return cost_widths(k)[-1]


def cycle_cost(
    kind: str, size: int, target: Mapping[int, float], helper: Mapping[int, float] | None = None
) -> tuple[float, str]:
    """(ms of one cycle's passes, the passes in words) of a cycle of ``kind`` (:data:`KINDS`) at block size K or
    lookahead k = ``size``, on the target's curve ``target`` and the verifier's / draft's ``helper`` (NaN where a
    width is outside a curve, or a helper is needed and missing):

    - prove-lossless: a block pass over [c, M × (K − 1)] (width K) and a verification pass over [c, y_1..y_K]
      (width K + 1; the engine re-feeds the last committed token): t(K) + t(K + 1).
    - prove-lossless fused: one pass a cycle over the widest fused tree, W = :func:`fused_width` (K): t(W).
    - prove: the block pass on the target, t(K), and the verifier's pass, t_v(K + 1).
    - sd: k draft passes of width 1 and the target's pass over [c, y_1..y_k]: k·t_d(1) + t(k + 1).
    """
    k = size
    if kind == "prove-lossless":
        return interp(target, k) + interp(target, k + 1), f"t({k}) + t({k + 1})"
    if kind == "prove-lossless fused":
        w = fused_width(k)
        return interp(target, w), f"t({w})"
    if kind == "prove":
        return interp(target, k) + (
            math.nan if helper is None else interp(helper, k + 1)
        ), f"t({k}) + t_v({k + 1})"
    if kind == "sd":
        return (math.nan if helper is None else k * interp(helper, 1)) + interp(target, k + 1), (
            f"{k}·t_d(1) + t({k + 1})"
        )
    raise ValueError(f"no cost model for {kind!r}: one of {', '.join(KINDS)}")


def speedup(tokens_per_cycle: float, cost_ms: float, target: Mapping[int, float]) -> float:
    """Tokens per cycle over the cycle's cost, in AR steps (AR: one pass of width 1 a token): tpc · t(1) / cost."""
    if not cost_ms or math.isnan(cost_ms):
        return math.nan
    return tokens_per_cycle * interp(target, 1) / cost_ms


def tokens_per_cycle(kind: str, acceptance: Sequence[float], size: int) -> float:
    """Tokens a cycle commits from per-depth acceptance ``a`` (``a[i]``: the share of cycles in which proposed
    position i, 0-based, was accepted, a leading run): the accepted run plus the correction / bonus token,
    1 + Σ_{i<K} a[i]; fused, y_1 is last cycle's correction: 1 + Σ_{1≤i<K} a[i] (what the second candidate rescues
    is not counted: ``a`` is the unfused rows'); prove adds no bonus: Σ_{i<K} a[i]."""
    a = list(acceptance)
    if kind == "prove-lossless fused":
        return 1 + sum(a[1:size])
    if kind == "prove":
        return sum(a[:size])
    return 1 + sum(a[:size])


def predict(
    curves: Mapping[str, Mapping[int, float]],
    acceptance: Mapping[str, Sequence[float]],
    *,
    draft: str | None,
    verifier: str | None,
    sd_k: int = 5,
    sizes: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Predicted speedup over AR (AR = one pass of width 1 per token) of each method on each target shape, from
    per-depth acceptance (``prove-bench``'s ``acceptance_by_depth``; :func:`tokens_per_cycle`) and the cycle's
    passes (:func:`cycle_cost`; t = the target's t(w), t_v the verifier's, t_d the draft's): prove-lossless and
    prove-lossless fused at K = :func:`block_sizes_for`, prove at those K, sd at k = ``sd_k``.

    ``fuse_groups=auto`` (the default) keeps fewer groups than the fused row's widest tree where width costs; where
    t(w) is flat it keeps them all. prove and sd rows appear for targets larger than their verifier / draft
    (``sizes``: parameter bytes per shape; without it, for every other shape). A row whose widths the curve does not
    cover is left out. Overheads outside the passes (the rule, cache crops, host syncs) are not in t(w): the
    prediction is an upper bound, tight where a pass costs much more than a cycle's bookkeeping.
    """
    rows: list[dict[str, Any]] = []

    def helps(helper: str | None, target: str) -> bool:
        if helper is None or helper not in curves or helper == target:
            return False
        return sizes is None or sizes.get(helper, 0) < sizes.get(target, 0)

    def add(
        target: str, kind: str, a: Sequence[float], k: int, helper: str | None = None, label: str = "K"
    ) -> None:
        tpc = tokens_per_cycle(kind, a, k)
        cost, passes = cycle_cost(kind, k, curves[target], None if helper is None else curves[helper])
        speed = speedup(tpc, cost, curves[target])
        if not math.isnan(speed):
            rows.append(
                {"target": target, "method": kind, "size": f"{label}={k}", "tokens_per_cycle": tpc,
                 "cycle_ms": cost, "passes": passes, "speedup": speed}
            )  # fmt: skip

    for target in curves:
        a = list(acceptance.get("prove-lossless", ()))
        for k in block_sizes_for(a):
            add(target, "prove-lossless", a, k)
            add(target, "prove-lossless fused", a, k)
        a = list(acceptance.get("prove", ()))
        if verifier is not None and helps(verifier, target):
            for k in block_sizes_for(a):
                add(target, "prove", a, k, verifier)
        a = list(acceptance.get("sd", ()))
        if draft is not None and helps(draft, target) and len(a) >= sd_k:
            add(target, "sd", a, sd_k, draft, "k")
    return rows


def load_curves(path: str | Path | None = None) -> dict[str, Any]:
    """A curves file (default :data:`CURVES_FILE`): its source, device, conditions and, per shape, t(w) in ms with
    integer widths (``shapes[name]["ms"]``)."""
    doc = json.loads(Path(path or CURVES_FILE).read_text())
    for spec in doc["shapes"].values():
        spec["ms"] = {int(w): float(v) for w, v in spec["ms"].items()}
    return doc


def row_cycle(row: Mapping[str, Any]) -> tuple[str, int] | None:
    """The cycle (:data:`KINDS`) and K or k of a bench row that has a cost model: greedy prove-lossless (fused or
    not), prove, and the draft family (sd, nsd, asd: k draft passes and one verification); None for the others."""
    if row.get("temperature") or not row.get("acceptance_by_depth"):
        return None
    params, depth = row.get("params") or {}, len(row["acceptance_by_depth"])
    method = row["method"]
    if method == "prove-lossless":
        kind = "prove-lossless fused" if params.get("fuse") else "prove-lossless"
        return kind, int(params.get("block_size") or depth)
    if method == "prove":
        return "prove", int(params.get("block_size") or depth)
    if method in ("sd", "nsd", "asd"):
        return "sd", int(params.get("k") or depth)
    return None


def predicted_section(rows: Sequence[Mapping[str, Any]], path: str | Path | None = None) -> dict[str, Any]:
    """bench.json's ``predicted``: for each greedy row with per-depth acceptance and a cost model
    (:func:`row_cycle`), its tokens per cycle measured here, its cycle's passes, and per shape of the curves file the
    predicted cycle time and speedup over AR on that shape (None where a width lies beyond the curve, or, for prove
    and the draft family, on the smallest shape, which is their verifier / draft on the others)."""
    doc = load_curves(path)
    shapes = doc["shapes"]
    helper = min(shapes, key=lambda s: shapes[s]["params_b"])
    out = []
    for row in rows:
        cycle = row_cycle(row)
        if cycle is None:
            continue
        kind, size = cycle
        tpc = row["tokens_per_cycle"]
        by_shape: dict[str, dict[str, float] | None] = {}
        passes = ""
        for shape, spec in shapes.items():
            needs_helper = kind in ("prove", "sd")
            cost, passes = cycle_cost(kind, size, spec["ms"], shapes[helper]["ms"] if needs_helper else None)
            speed = speedup(tpc, cost, spec["ms"])
            usable = not math.isnan(speed) and not (needs_helper and shape == helper)
            by_shape[shape] = {"speedup": speed, "cycle_ms": cost} if usable else None
        label = "k" if kind == "sd" else "K"
        out.append({"name": row["name"], "cycle": kind, "size": f"{label}={size}", "tokens_per_cycle": tpc,
                    "passes": passes, "by_shape": by_shape})  # fmt: skip
    return {
        "predicted": True,
        "source": doc["source"],
        "device": doc["device"],
        "measured": doc["measured"],
        "conditions": doc["conditions"],
        "file": CURVES_FILE.name if path is None else str(path),
        "curves_ms": {s: spec["ms"] for s, spec in shapes.items()},
        "labels": {s: spec["label"] for s, spec in shapes.items()},
        "helper": helper,
        "rows": out,
    }
