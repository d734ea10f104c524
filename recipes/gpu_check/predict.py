"""What the cost curve predicts: each method's speedup over AR from t(w) and per-depth acceptance rates.

The acceptance comes from a ``prove-bench`` report of a model on a task (``--acceptance bench.json``) or, by
default, the tiny demo's (``gpu_check_acceptance.json``); the widths the prediction reads
(:func:`prediction_widths`) are timed by the curve, so every predicted row has its passes measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prove.recipes.gpu_check.config import ACCEPTANCE_DEFAULT


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


def prediction_widths(acceptance: Mapping[str, Sequence[float]], sd_k: int = 5) -> list[int]:
    """Every width :func:`predict` reads for these acceptance rates (on the target's, verifier's or draft's
    curve): 1 (AR, sd's draft step), K and K + 1 for each block size K, the fused tree's width, and k + 1 for sd."""
    widths = {1}
    for k in block_sizes_for(list(acceptance.get("prove-lossless", ()))):
        widths |= {k, k + 1, fused_width(k)}
    for k in block_sizes_for(list(acceptance.get("prove", ()))):
        widths |= {k, k + 1}
    if len(acceptance.get("sd", ())) >= sd_k:
        widths.add(sd_k + 1)
    return sorted(widths)


def curve_widths(widths: Iterable[int], needed: Iterable[int]) -> tuple[int, ...]:
    """The widths to time: ``widths``, and each ``needed`` width outside their range (inside it, a width is
    interpolated between its measured neighbours; outside it, :func:`interp` has nothing to go on)."""
    base = set(widths)
    lo, hi = min(base), max(base)
    return tuple(sorted(base | {w for w in needed if w < lo or w > hi}))


def predict(
    curves: Mapping[str, Mapping[int, float]],
    acceptance: Mapping[str, Sequence[float]],
    *,
    draft: str | None,
    verifier: str | None,
    sd_k: int = 5,
    sizes: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Predicted speedup over AR (AR = one pass of width 1 per token) of each method on each target shape.

    ``a[i]`` is the share of cycles in which proposed position i (0-based) was accepted, a leading run
    (``prove-bench``'s ``acceptance_by_depth``); t = the target's t(w), t_v the verifier's, t_d the draft's.

    - prove-lossless, block K: a block pass over [c, M × (K − 1)] (width K) and a verification pass over
      [c, y_1..y_K] (width K + 1; the engine re-feeds the last committed token); commits the accepted run
      plus the correction / bonus token: tokens/cycle = 1 + Σ_{i<K} a[i], cost = t(K) + t(K + 1).
    - prove-lossless fused, ``fuse_groups=all`` with the second candidate: one pass per cycle over the widest
      fused tree, W = :func:`fused_width` (K) = (K + 3)(K − 1) + 2 entries; y_1 is last cycle's correction, so
      tokens/cycle = 1 + Σ_{1≤i<K} a[i] (what the second candidate rescues is not counted: ``a`` is the unfused
      rows' acceptance), cost = t(W). ``fuse_groups=auto`` (the default) keeps fewer groups where width costs (a
      narrower pass than this row's on a rising curve); where t(w) is flat it keeps them all.
    - prove, block K: the block pass on the target, t(K), and the verifier's pass t_v(K + 1); commits the
      accepted run (y_1 always): tokens/cycle = Σ_{i<K} a[i].
    - sd, k: k draft passes of width 1 and the target's pass over [c, y_1..y_k]: cost = k·t_d(1) + t(k + 1),
      tokens/cycle = 1 + Σ_{i<k} a[i].

    prove and sd rows appear for targets larger than their verifier / draft (``sizes``: parameter bytes
    per shape; without it, for every other shape). A row whose widths the curve does not cover is left out
    (:func:`curve_widths` makes a run time them). Overheads outside the passes (the rule, cache crops, host
    syncs) are not in t(w): the prediction is an upper bound, tight where a pass costs much more than a
    cycle's bookkeeping (:func:`predictor_check` measures the gap).
    """
    rows: list[dict[str, Any]] = []

    def helps(helper: str | None, target: str) -> bool:
        if helper is None or helper not in curves or helper == target:
            return False
        return sizes is None or sizes.get(helper, 0) < sizes.get(target, 0)

    def add(target: str, method: str, size: str, tpc: float, cost: float, passes: str) -> None:
        speed = tpc * interp(curves[target], 1) / cost if cost and not math.isnan(cost) else math.nan
        if not math.isnan(speed):
            rows.append(
                {"target": target, "method": method, "size": size, "tokens_per_cycle": tpc,
                 "cycle_ms": cost, "passes": passes, "speedup": speed}
            )  # fmt: skip

    for target, curve in curves.items():
        a = list(acceptance.get("prove-lossless", ()))
        for k in block_sizes_for(a):
            add(target, "prove-lossless", f"K={k}", 1 + sum(a[:k]), interp(curve, k) + interp(curve, k + 1),
                f"t({k}) + t({k + 1})")  # fmt: skip
            w = fused_width(k)
            add(target, "prove-lossless fused", f"K={k}", 1 + sum(a[1:k]), interp(curve, w), f"t({w})")
        a = list(acceptance.get("prove", ()))
        if verifier is not None and helps(verifier, target):
            for k in block_sizes_for(a):
                add(target, "prove", f"K={k}", sum(a[:k]), interp(curve, k) + interp(curves[verifier], k + 1),
                    f"t({k}) + t_v({k + 1})")  # fmt: skip
        a = list(acceptance.get("sd", ()))
        if draft is not None and helps(draft, target) and len(a) >= sd_k:
            add(target, "sd", f"k={sd_k}", 1 + sum(a[:sd_k]), sd_k * interp(curves[draft], 1) + interp(curve, sd_k + 1),
                f"{sd_k}·t_d(1) + t({sd_k + 1})")  # fmt: skip
    return rows


def predictor_check(
    decode: Mapping[str, Any] | None, curve: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The prediction against a measurement: prove-lossless on the decode check's model (same shape and dtype as
    one cost curve), predicted from that curve and the acceptance it measured, vs its measured speedup over ar.
    The gap is what the passes do not contain: the engine's per-cycle work on the host."""
    if not decode or not curve or decode["shape"] not in curve["ms"]:
        return None
    run = decode["dtypes"].get(curve["dtype"])
    row = (run or {}).get("rows", {}).get("prove-lossless")
    if not row or "error" in row or not row.get("speedup_vs_ar"):
        return None
    acc = list(row["acceptance_by_depth"])
    t = {int(w): v for w, v in curve["ms"][decode["shape"]].items()}
    pred = [r for r in predict({"m": t}, {"prove-lossless": acc}, draft=None, verifier=None)
            if r["method"] == "prove-lossless" and r["size"] == f"K={len(acc)}"]  # fmt: skip
    if not pred:
        return None
    return {
        "shape": decode["shape"],
        "dtype": curve["dtype"],
        "block_size": len(acc),
        "tokens_per_cycle_measured": row["tokens_per_cycle"],
        "predicted": pred[0]["speedup"],
        "measured": row["speedup_vs_ar"],
    }


def load_acceptance(path: str | Path | None) -> dict[str, Any]:
    """Per-depth acceptance by method: ``gpu_check_acceptance.json``'s format, or a prove-bench bench.json
    (the first row of each method, i.e. its default parameters or the first point of a sweep)."""
    p = Path(path) if path is not None else ACCEPTANCE_DEFAULT
    if not p.is_file():
        raise ValueError(
            f"--acceptance {p}: no such file; give a prove-bench bench.json (outputs/bench/bench.json)"
        )
    data = json.loads(p.read_text())
    if "rows" in data:
        methods: dict[str, Any] = {}
        for row in data["rows"]:
            acc = row.get("acceptance_by_depth") or []
            if row["method"] in ("prove-lossless", "prove", "sd") and row["method"] not in methods and acc:
                methods[row["method"]] = {
                    "params": row.get("params") or {},
                    "acceptance_by_depth": [0.0 if v is None else v for v in acc],
                }
        data = {"source": str(p), "methods": methods}
    if not isinstance(data.get("methods"), dict) or not data["methods"]:
        raise ValueError(
            f"--acceptance {p}: no per-depth acceptance found (need a bench.json with prove-lossless / prove / sd rows)"
        )
    return data
