"""What ``tools/bench_mars_step.py``'s records say: a profiled step's CPU time by kind of operator, the medians and
pairwise ratios over repeats, the Markdown table and the run's provenance (pure functions of the records, apart from
:func:`profiled` and :func:`provenance`, which read the profiler and the machine)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

PROFILE_KINDS = ("matmul", "attention", "vocabulary", "other")


def breakdown(ops: list[tuple[str, list[list[int]], float]], vocab: int) -> dict[str, float]:
    """Seconds of operators' own CPU time by kind, from ``(name, input shapes, self seconds)`` rows (the profiler's
    averages grouped by input shape): ``vocabulary`` where any input has a dimension of ``vocab`` (the embedding
    rows: the head's products, the cross-entropy's softmax, the merged weight of a trainable ``<|mask|>`` row),
    else ``attention`` for the scaled-dot-product kernels, ``matmul`` for the other matrix products, ``other`` for
    the rest; with ``total``."""
    out = dict.fromkeys(PROFILE_KINDS, 0.0)
    for name, shapes, seconds in ops:
        if any(vocab in shape for shape in shapes if isinstance(shape, list)):
            kind = "vocabulary"
        elif "scaled_dot_product" in name:
            kind = "attention"
        elif name in ("aten::mm", "aten::addmm", "aten::bmm"):
            kind = "matmul"
        else:
            kind = "other"
        out[kind] += seconds
    out["total"] = sum(out[k] for k in PROFILE_KINDS)
    return out


def profiled(step: Any) -> list[tuple[str, list[list[int]], float]]:
    """Run ``step()`` under ``torch.profiler`` (CPU, shapes recorded); its operators as :func:`breakdown` reads them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    return [
        (
            e.key,
            [list(s) if isinstance(s, (list, tuple)) else s for s in e.input_shapes],
            e.self_cpu_time_total / 1e6,
        )
        for e in prof.key_averages(group_by_input_shape=True)
    ]


def summarise(runs: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """Per variant the median over repeats of its s/step and the largest peak RSS; the ratios of mars to plain and to
    mars-full per repeat (one machine state each), ``ratios`` the median over repeats of those pairwise ratios (the
    statistic; ``ratios_of_medians`` the ratio of the variants' medians, for comparison), and ``headline``: MARS /
    plain with MARS's s/step beside it (a slower plain step lowers the ratio, not MARS's seconds)."""

    def ratios(s: dict[str, float]) -> dict[str, float]:
        pairs = {"mars/plain": ("mars", "plain"), "mars/mars-full": ("mars", "mars-full")}
        return {name: s[a] / s[b] for name, (a, b) in pairs.items() if a in s and b in s}

    by_repeat: dict[int, dict[str, float]] = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["variant"]] = r["median_s"]
    variants = {
        v: {
            "median_s": statistics.median(r["median_s"] for r in runs if r["variant"] == v),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs if r["variant"] == v),
            "first_loss": next(r["first_loss"] for r in runs if r["variant"] == v),
        }
        for v in order
    }
    per_repeat = [ratios(by_repeat[k]) for k in sorted(by_repeat)]
    names = [n for n in ("mars/plain", "mars/mars-full") if all(n in rat for rat in per_repeat)]
    pairwise = {n: statistics.median(rat[n] for rat in per_repeat) for n in names}
    top = None
    if "mars/plain" in pairwise:
        top = {
            "mars_over_plain": pairwise["mars/plain"],
            "pairs": [rat["mars/plain"] for rat in per_repeat],
            "mars_s": variants["mars"]["median_s"],
            "plain_s": variants["plain"]["median_s"],
        }
    return {
        "variants": variants,
        "ratios": pairwise,
        "ratios_of_medians": ratios({v: s["median_s"] for v, s in variants.items()}),
        "ratios_by_repeat": per_repeat,
        "headline": top,
    }


def headline(summary: dict[str, Any]) -> str | None:
    """One line: MARS / plain (the median of the pairwise ratios, and the pairs) with MARS's and plain's s/step."""
    h = summary.get("headline")
    if h is None:
        return None
    pairs = ", ".join(f"{x:.2f}×" for x in h["pairs"])
    return (
        f"MARS / plain: **{h['mars_over_plain']:.2f}×** (median of {len(h['pairs'])} pairwise ratios: {pairs}); "
        f"MARS {h['mars_s']:.3g} s/step, plain {h['plain_s']:.3g} s/step"
    )


def table(result: dict[str, Any]) -> str:
    """The Markdown table: a row per repeat (its order) and one of the medians (each variant's median s/step, and the
    median of the pairwise ratios), then :func:`headline`."""
    order, runs, summary = result["order"], result["runs"], result["summary"]
    isolated = all(r["isolated"] for r in runs)

    def cell(s: float, rss: int) -> str:
        return f"{s:.3g} s, {rss / 1e9:.2f} GB" if isolated else f"{s:.3g} s"

    names = [n for n in ("mars/plain", "mars/mars-full") if n in summary["ratios"]]
    head = ["run", *order, *(n.replace("/", " / ") for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for k, rat in enumerate(summary["ratios_by_repeat"]):
        mine = sorted((r for r in runs if r["repeat"] == k), key=lambda r: r["index"])
        by = {r["variant"]: r for r in mine}
        label = f"{k + 1} ({', '.join(r['variant'] for r in mine)})"
        cells = [cell(by[v]["median_s"], by[v]["peak_rss_bytes"]) for v in order]
        lines.append("| " + " | ".join([label, *cells, *(f"{rat[n]:.2f}×" for n in names)]) + " |")
    med = summary["variants"]
    cells = [cell(med[v]["median_s"], med[v]["peak_rss_bytes"]) for v in order]
    rat = summary["ratios"]
    lines.append("| " + " | ".join(["median", *cells, *(f"**{rat[n]:.2f}×**" for n in names)]) + " |")
    if not isolated:
        lines.append("\n(--in-process: one process ran every variant, so no peak RSS per variant)")
    lines += profile_table(runs, order)
    if (line := headline(summary)) is not None:
        lines += ["", line]
    return "\n".join(lines)


def profile_table(runs: list[dict[str, Any]], order: list[str]) -> list[str]:
    """The second table's lines (none without ``--profile``): per variant, its last repeat's profiled step."""
    profiles = {r["variant"]: r["profile"] for r in runs if r.get("profile")}
    if not profiles:
        return []
    head = "| profiled step (operators' own CPU s) | " + " | ".join([*PROFILE_KINDS, "total"]) + " |"
    lines = ["", head, "|---|" + "---:|" * (len(PROFILE_KINDS) + 1)]
    for v in order:
        if v in profiles:
            cells = [f"{profiles[v][k]:.2f}" for k in (*PROFILE_KINDS, "total")]
            lines.append("| " + " | ".join([v, *cells]) + " |")
    return lines


def provenance() -> dict[str, Any]:
    """The code and the machine: commit (+ whether train/ or tools/ had local changes), CPUs, load."""

    root = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str | None:
        try:
            r = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=root)
        except OSError:
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--", "train", "tools", "data")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "local_changes": bool(status) if status is not None else None,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "loadavg_start": list(os.getloadavg()),
    }
