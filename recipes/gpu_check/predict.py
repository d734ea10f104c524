"""What the cost curve predicts: each method's speedup over AR from t(w) and per-depth acceptance rates (the arithmetic:
``prove.decode.bench.predicted``, shared with prove-bench's predicted table; here, which widths to time and where
the acceptance comes from).

The acceptance comes from a ``prove-bench`` report of a model on a task (``--acceptance bench.json``) or, by
default, the tiny demo's (``gpu_check_acceptance.json``); the widths the prediction reads
(:func:`prediction_widths`) are timed by the curve, so every predicted row has its passes measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prove.decode.bench.predicted import block_sizes_for, fused_width, interp, predict
from prove.recipes.gpu_check.config import ACCEPTANCE_DEFAULT

__all__ = [
    "block_sizes_for",
    "curve_widths",
    "fused_width",
    "interp",
    "load_acceptance",
    "predict",
    "prediction_widths",
    "predictor_check",
]


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
