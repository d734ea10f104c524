"""The plots of ``prove-bench`` (matplotlib, Agg backend, PNG), drawn from bench.json's report alone.

- ``acceptance_by_position.png``: per block position i, the share of cycles in which the rule accepted
  position i (a leading run, so it decays with i); with the trace, the share of cycles whose position i
  matched the target's greedy token (ProVe's decay curve); ProVe's published 32B points as markers (depths 1–8
  joined, 16 alone: nothing drawn where the paper states nothing).
- ``acceptance_by_category.png`` (prompts with categories: a named suite): one panel per row that proposes blocks,
  one curve per category, ProVe's published points in each.
- ``tokens_per_cycle_by_category.png`` (the same): tokens per cycle by position in the response (bins of
  ``position_bin``), one panel per row, one curve per category.
- ``tokens_per_cycle.png``: mean tokens committed per cycle along the response.
- ``roc.png``: ROC curves and AUC of p̃, q and p̃·q for predicting "matches greedy".
- ``speed_accuracy.png``: speedup over AR against accuracy (or agreement with AR), sweeps joined by lines.
- ``speed_quality.png`` (rows with a quality record): speedup against token agreement with greedy and against the
  log-likelihood relative to AR's output (:mod:`prove.decode.bench.quality`), the θ sweep's Pareto.
- ``vllm_concurrency.png`` (``backend=vllm``): vLLM's tokens/s against requests in flight, one line per vLLM row (a
  method at one point of its rule's sweep, ``vllm prove θ=0.1``), our engine's rows (one request in flight) as
  horizontal lines, each speculative row's crossover with vLLM ar marked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prove.decode.bench.published import PROVE_32B_BY_DEPTH, PROVE_32B_LABEL
from prove.decode.bench.rows import param_label

LABELS = {"p_tilde": "p̃ (proposer)", "q": "q (verifier)", "p_tilde_q": "p̃·q"}


def _figure(title: str, size: tuple[float, float] = (8.5, 4.5)) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    fig, ax = plt.subplots(figsize=size, dpi=110)
    # ten colours, then the same ten dashed, then dotted: a sweep has more rows than a palette has colours
    ax.set_prop_cycle(
        cycler(linestyle=["-", "--", ":"]) * cycler(color=plt.rcParams["axes.prop_cycle"].by_key()["color"])
    )
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _legend(ax: Any) -> None:
    """Outside the axes, on the right: curves of a sweep crowd every corner."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _finite(xs: list[Any]) -> list[float]:
    return [math.nan if x is None else float(x) for x in xs]


def plot_acceptance(report: Mapping[str, Any], path: Path) -> Path:
    fig, ax = _figure("Acceptance by block position")
    for row in report["rows"]:
        acc = row.get("acceptance_by_depth") or []
        if acc:
            ax.plot(range(1, len(acc) + 1), _finite(acc), marker="o", ms=3, label=f"{row['name']}: accepted")
    trace = report.get("trace") or {}
    match = trace.get("match_by_depth") or []
    if match:
        ax.plot(
            range(1, len(match) + 1), _finite(match), "k--", marker="s", ms=3,
            label=f"position i matched greedy (trace, K={trace.get('block_size')})",
        )  # fmt: skip
    if ax.lines:
        depths = max(len(line.get_xdata()) for line in ax.lines)
        _draw_published(ax, depths)
    ax.set_xlabel("position in the proposed block (1 = next token)")
    ax.set_ylabel("share of cycles")
    ax.set_ylim(-0.02, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if ax.lines:
        _legend(ax)
    else:
        ax.text(0.5, 0.5, "no method proposed blocks", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


def _draw_published(ax: Any, depths: int) -> None:
    """ProVe's published 32B points up to ``depths``: a line through the consecutive ones it states (1–8), the
    others as markers alone; no line over depths it does not state."""
    pts = sorted((d, v) for d, v in PROVE_32B_BY_DEPTH.items() if d <= max(depths, 1))
    run = [(d, v) for d, v in pts if d <= 8]
    (line,) = ax.plot([d for d, _ in run], [v for _, v in run], color="0.35", lw=1.2, ls="-.", marker="D", ms=4,
                      label=PROVE_32B_LABEL)  # fmt: skip
    alone = [(d, v) for d, v in pts if d > 8]
    if alone:
        ax.plot(
            [d for d, _ in alone], [v for _, v in alone], ls="none", marker="D", ms=4, color=line.get_color()
        )


def _panels(n: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), dpi=110, squeeze=False)
    fig.suptitle(title, fontsize=11)
    flat = [a for line in axes for a in line]
    for ax in flat[n:]:
        ax.set_visible(False)
    for ax in flat[:n]:
        ax.grid(alpha=0.3)
    return fig, flat[:n]


MAX_PANELS = 9
"""Rows drawn at most in a per-category figure (the first ones of bench.md's table)."""


def plot_acceptance_by_category(report: Mapping[str, Any], path: Path) -> Path:
    cats = [c["name"] for c in report.get("categories") or []]
    rows = [r for r in report["rows"] if r.get("acceptance_by_depth") and r.get("by_category")][:MAX_PANELS]
    fig, axes = _panels(max(len(rows), 1), "Accepted at block position i, by category")
    for ax, row in zip(axes, rows, strict=False):
        for c in cats:
            acc = (row["by_category"].get(c) or {}).get("acceptance_by_depth") or []
            if acc:
                ax.plot(range(1, len(acc) + 1), _finite(acc), marker="o", ms=3, label=c)
        _draw_published(ax, len(row["acceptance_by_depth"]))
        ax.set_title(row["name"], fontsize=9)
        ax.set_xlabel("block position i")
        ax.set_ylabel("share of cycles")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if rows:
        axes[0].legend(fontsize=6, loc="lower left")
    else:
        axes[0].text(
            0.5, 0.5, "no method proposed blocks", ha="center", va="center", transform=axes[0].transAxes
        )
    return _save(fig, path)


def plot_tokens_per_cycle_by_category(report: Mapping[str, Any], path: Path) -> Path:
    cats = [c["name"] for c in report.get("categories") or []]
    rows = [r for r in report["rows"] if r["method"] != "ar" and (r.get("by_position") or {}).get("start")][
        :MAX_PANELS
    ]
    fig, axes = _panels(max(len(rows), 1), "Tokens per cycle by position in the response, by category")
    for ax, row in zip(axes, rows, strict=False):
        size = row["by_position"]["bin_size"]
        for c in cats:
            curve = (row.get("by_category", {}).get(c) or {}).get("tokens_per_cycle_by_position") or {}
            if curve.get("start"):
                ax.plot(
                    [s + size / 2 for s in curve["start"]], _finite(curve["mean"]), marker="o", ms=3, label=c
                )
        ax.set_title(row["name"], fontsize=9)
        ax.set_xlabel(f"response position (bins of {size} tokens)")
        ax.set_ylabel("tokens per cycle")
        ax.set_ylim(bottom=0)
    if rows and axes[0].lines:
        axes[0].legend(fontsize=6, loc="lower right")
    return _save(fig, path)


def plot_tokens_per_cycle(report: Mapping[str, Any], path: Path) -> Path:
    fig, ax = _figure("Tokens committed per cycle along the response")
    bin_size = 1
    for row in report["rows"]:
        curve = row.get("tokens_per_cycle_by_position") or {}
        if curve.get("start"):
            bin_size = curve["bin_size"]
            centers = [s + bin_size / 2 for s in curve["start"]]
            ax.plot(centers, _finite(curve["mean"]), marker="o", ms=3, label=row["name"])
    ax.set_xlabel(f"response position (bins of {bin_size} tokens)")
    ax.set_ylabel("tokens per cycle (incl. correction/bonus)")
    ax.set_ylim(bottom=0)
    if ax.lines:
        _legend(ax)
    return _save(fig, path)


def plot_roc(report: Mapping[str, Any], path: Path) -> Path:
    trace = report.get("trace") or {}
    roc = trace.get("roc") or {}
    title = "ROC: predicting “matches greedy”"
    if roc:
        title += f" (K={trace.get('block_size')}, {trace.get('positions')} positions)"
    fig, ax = _figure(title, size=(6.0, 5.4))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls=":", label="chance (AUC 0.5)")
    for name, curve in roc.items():
        ax.plot(curve["fpr"], curve["tpr"], lw=1.8, label=f"{LABELS.get(name, name)}: AUC {curve['auc']:.3f}")
    if not roc:
        why = trace.get("skipped") or "no trace (needs a block model and both classes)"
        ax.text(0.5, 0.5, why[:80], ha="center", va="center", transform=ax.transAxes, fontsize=8)
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_aspect("equal")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def _sort_key(v: Any) -> tuple[int, Any]:
    """Numbers first, in order; then anything else (``fuse_groups=all``) by its text."""
    return (0, v) if isinstance(v, (int, float)) else (1, str(v))


def _draw_tradeoff(ax: Any, report: Mapping[str, Any], value: Any, scale: float = 100.0) -> None:
    """Speedup (x) against ``value(row)`` × ``scale`` (y), one line per method, a sweep drawn in its parameter's
    order and its points labelled."""
    families: dict[str, list[Mapping[str, Any]]] = {}
    for row in report["rows"]:
        families.setdefault(row["method"], []).append(row)
    for method, rows in families.items():
        pts = [(r.get("speedup_total"), value(r), r) for r in rows]
        pts = [p for p in pts if p[0] is not None and p[1] is not None and not math.isnan(p[0])]
        if not pts:
            continue
        # a sweep is drawn in the order of its parameter (θ ascending), else by speed
        pts.sort(key=lambda p: (tuple(_sort_key(v) for v in p[2].get("swept", {}).values()), p[0]))
        (line,) = ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], marker="o", ms=5, label=method)
        for i, (x, y, r) in enumerate(pts):
            note = " ".join(param_label(k, v) for k, v in r.get("swept", {}).items())
            if note and len(pts) > 1:  # label the points of a sweep, alternately above and below
                ax.annotate(
                    note,
                    (x, scale * y),
                    textcoords="offset points",
                    xytext=(4, 5 if i % 2 == 0 else -11),
                    fontsize=7,
                    color=line.get_color(),
                )
    ax.axvline(1.0, color="0.6", lw=1, ls=":")
    ax.set_xlabel("speedup over AR (total tokens / total time)")
    ax.margins(x=0.08, y=0.15)
    ax.set_xlim(left=0)


def plot_speed_accuracy(report: Mapping[str, Any], path: Path) -> Path:
    with_answers = report["prompts"].get("with_answers", 0) > 0
    key, ylabel = ("accuracy", "task accuracy") if with_answers else ("agreement", "agreement with AR")
    fig, ax = _figure(f"Speed / {ylabel} trade-off")
    _draw_tradeoff(ax, report, lambda r: r[key])
    ax.set_ylabel(f"{ylabel} (%)")
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, -3), min(high, 103))
    if ax.lines:
        _legend(ax)
    return _save(fig, path)


def plot_speed_quality(report: Mapping[str, Any], path: Path) -> Path:
    """Speedup against the quality section's two numbers a lossy row moves: token agreement with greedy, and the
    log-likelihood of its output under the quality model relative to AR's (0: as likely as AR's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    fig.suptitle("Speed / quality trade-off (teacher-forced quality, bench.md's quality table)", fontsize=11)
    panels = (
        (lambda r: (r.get("quality") or {}).get("token_agreement"), 100.0, "token agreement with greedy (%)"),
        (
            lambda r: (r.get("quality") or {}).get("loglik_vs_ar"),
            1.0,
            "Δ log-likelihood / token vs AR (nats)",
        ),
    )
    for ax, (value, scale, label) in zip(axes, panels, strict=True):
        ax.grid(alpha=0.3)
        _draw_tradeoff(ax, report, value, scale)
        ax.set_ylabel(label)
    axes[1].axhline(0.0, color="0.6", lw=1, ls=":")
    if axes[1].lines:
        _legend(axes[1])
    return _save(fig, path)


def plot_vllm_concurrency(report: Mapping[str, Any], path: Path) -> Path:
    vllm = report["vllm"]
    fig, ax = _figure("Throughput against requests in flight (vLLM) beside our engine (one request)")
    lines: dict[str, Any] = {}
    for row in vllm["rows"]:
        lines.setdefault(row["name"], []).append((row["in_flight"], row["tokens_per_s"]))
    colors = {}
    for name, pts in lines.items():
        pts.sort()
        (line,) = ax.plot([p[0] for p in pts], _finite([p[1] for p in pts]), marker="o", ms=4, label=name)
        colors[name] = line.get_color()
    # our one-request lines: ar, unfused prove-lossless and the fastest fused row (the rest overlap them)
    ours = [
        r
        for r in report["rows"]
        if r["method"] in ("ar", "prove-lossless") and not (r.get("params") or {}).get("fuse")
    ]
    fused = [
        r for r in report["rows"] if r["method"] == "prove-lossless" and (r.get("params") or {}).get("fuse")
    ]
    ours += [max(fused, key=lambda r: r["tokens_per_s"])] if fused else []
    for r in ours:
        ax.axhline(r["tokens_per_s"], lw=1, ls="--", color="0.5" if r["method"] == "ar" else "0.2")
        ax.annotate(f"ours: {r['name']}", (1, r["tokens_per_s"]), textcoords="offset points", xytext=(2, 2),
                    fontsize=7, color="0.3")  # fmt: skip
    for name, cross in (vllm.get("crossover") or {}).items():
        if cross and cross.get("estimate"):
            ax.axvline(cross["estimate"], color=colors.get(name, "k"), lw=1, ls=":")
            ax.annotate(
                f"{name} = vllm ar at ≈ {cross['estimate']:.1f}",
                (cross["estimate"], 0),
                textcoords="offset points",
                xytext=(3, 10),
                rotation=90,
                fontsize=7,
                color=colors.get(name, "k"),
            )
    ax.set_xscale("log", base=2)
    ticks = sorted({row["in_flight"] for row in vllm["rows"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("tokens/s (all requests)")
    ax.set_ylim(bottom=0)
    if ax.lines:
        _legend(ax)
    return _save(fig, path)


PLOTS = {
    "acceptance_by_position": plot_acceptance,
    "tokens_per_cycle": plot_tokens_per_cycle,
    "roc": plot_roc,
    "speed_accuracy": plot_speed_accuracy,
}


def write_plots(report: Mapping[str, Any], output_dir: str | Path) -> dict[str, Path]:
    """Every plot of :data:`PLOTS` as ``<name>.png`` in ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = {name: fn(report, out / f"{name}.png") for name, fn in PLOTS.items()}
    if any(r.get("quality") for r in report["rows"]):
        plots["speed_quality"] = plot_speed_quality(report, out / "speed_quality.png")
    if report.get("categories"):
        plots["acceptance_by_category"] = plot_acceptance_by_category(
            report, out / "acceptance_by_category.png"
        )
        plots["tokens_per_cycle_by_category"] = plot_tokens_per_cycle_by_category(
            report, out / "tokens_per_cycle_by_category.png"
        )
    if report.get("vllm"):
        plots["vllm_concurrency"] = plot_vllm_concurrency(report, out / "vllm_concurrency.png")
    return plots
