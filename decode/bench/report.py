"""bench.json and bench.md: the Markdown table, the pass-cost section, the header, the environment record."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

from prove.decode.bench.published import PROVE_32B_BY_DEPTH, PROVE_32B_LABEL
from prove.decode.bench.rows import param_label

SCHEMA = "prove-bench/1"


def _num(v: Any, spec: str = ".2f", dash: str = "–") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return dash
    return format(v, spec)


def render_table(
    rows: Sequence[Mapping[str, Any]], skipped: Mapping[str, Sequence[float]] | None = None
) -> str:
    """The Markdown table of bench.json's rows, with its footnotes; ``skipped``: the greedy-only methods a
    temperature sweep gave no sampled row (bench.json's ``greedy_only``)."""
    head = [
        "method", "params", "tok/cycle¹", "model/tok", "verifier/tok", "draft/tok", "tok/s", "engine ms/cycle³",
        "speedup (median)", "speedup (total)", "= AR²", "first div. (mean)", "accuracy",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    flagged = False
    for r in rows:
        agree = _agree(r, r["agreement"])
        if r.get("lossless") and r["agreement"] < 1:
            agree += " ⚠"
            flagged = True
        cells = [
            r["name"],
            " ".join(param_label(k, v) for k, v in (r.get("params") or {}).items()) or "–",
            _num(r["tokens_per_cycle"]),
            _num(r["model_passes_per_token"]),
            _num(r["verifier_passes_per_token"] or None),
            _num(r["draft_passes_per_token"] or None),
            _num(r["tokens_per_s"], ".1f"),
            _num(r.get("engine_ms_per_cycle"), ".3f"),
            _speedup(r, r["speedup_median"]),
            _speedup(r, r["speedup_total"]),
            agree,
            _num(r["mean_first_divergence"], ".1f"),
            _num(None if r["accuracy"] is None else 100 * r["accuracy"], ".1f", "n/a")
            + ("%" if r["accuracy"] is not None else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "¹ mean tokens committed per cycle, counting the correction / bonus token (AR = 1). "
        "Passes per token count forward passes of each model. Speedups are tokens/s over AR's in the same run.",
        "² share of prompts whose output equals AR's token for token; first div. = mean position of the first "
        "differing token where they differ.",
        "³ wall time a cycle spends outside the models' forward passes: proposing from logits, the rule, commits, "
        "cache crops (host time; – for transformers' rows).",
    ]
    if flagged:
        lines.append("⚠ a lossless method disagreed with AR (expected only from low-precision numerics).")
    lines += _sampling_notes(rows, skipped)
    return "\n".join(lines) + "\n"


def _sampled(r: Mapping[str, Any]) -> bool:
    return bool(r.get("temperature"))


def _agree(r: Mapping[str, Any], agreement: float) -> str:
    """The "= AR" cell: greedy rows only (a sampled row's tokens are draws, not AR's greedy ones)."""
    return "–" if _sampled(r) else f"{100 * agreement:.0f}%"


def _speedup(r: Mapping[str, Any], value: Any) -> str:
    """A speedup cell; a sampled row's that is over greedy ``ar`` (no AR row ran at its temperature) says so."""
    cell = _num(value) + "×"
    if _sampled(r) and r.get("speedup_over", "ar") == "ar":
        cell += " (vs greedy ar)"
    return cell


def _sampling_notes(
    rows: Sequence[Mapping[str, Any]], skipped: Mapping[str, Sequence[float]] | None = None
) -> list[str]:
    """The footnote on sampled rows (when any ran), and each greedy-only method a temperature sweep gave no row."""
    lines = []
    if any(_sampled(r) for r in rows):
        seed = next(r["sampling"]["seed"] for r in rows if _sampled(r) and r.get("sampling"))
        lines.append(
            "Sampled rows (T > 0; prompt i drawn with seed "
            f"{seed} + i, the same in every repeat): speedups over the AR row at the same temperature, top-p and "
            "top-k run here (`ar T=…`), or over greedy `ar` where marked (vs greedy ar); = AR is for greedy rows (–)."
        )
    for method, temps in (skipped or {}).items():
        lines.append(f"{method}: greedy only, no {', '.join(f'T={t:g}' for t in temps)} row.")
    return lines


def render_quality_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """bench.md's quality section (rows with a ``quality`` record, :mod:`prove.decode.bench.quality`); empty when no
    row has one."""
    scored = [r for r in rows if r.get("quality")]
    if not scored:
        return ""
    head = ["method", "params", "= AR²", "token agreement⁶", "log-lik/token", "Δ log-lik vs AR⁶", "length",
            "distinct-1", "distinct-2"]  # fmt: skip
    lines = [
        "",
        "## Quality beside AR (teacher-forced, untimed)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|",
    ]
    for r in scored:
        q = r["quality"]
        share = q["token_agreement"]
        cells = [
            r["name"],
            " ".join(param_label(k, v) for k, v in (r.get("params") or {}).items()) or "–",
            f"{100 * r['agreement']:.0f}%",
            _num(None if share is None else 100 * share, ".1f") + ("%" if share is not None else ""),
            _num(q["loglik"], ".3f"),
            _num(q["loglik_vs_ar"], "+.3f"),
            _num(q["mean_length"], ".1f"),
            _num(q["distinct"].get("1"), ".3f"),
            _num(q["distinct"].get("2"), ".3f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "⁶ token agreement: the share of a row's output tokens that the target's greedy choice after the same prefix "
        "would have picked; log-lik: the mean per-token log-probability of the output under the quality model "
        "(`quality_model`, else the target), Δ its difference from AR's output on the same prompt (mean over "
        "prompts; < 0: text that model finds less likely). Length in tokens; distinct-n: unique n-grams / n-grams.",
        "",
    ]
    return "\n".join(lines) + "\n"


def _pct(v: Any) -> str:
    return _num(None if v is None else 100 * v, ".0f") + ("%" if v is not None and not _nan(v) else "")


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _params(r: Mapping[str, Any]) -> str:
    return " ".join(param_label(k, v) for k, v in (r.get("params") or {}).items()) or "–"


def render_suites(report: Mapping[str, Any]) -> str:
    """bench.md's lines on the named suites: what each is, where its file came from, how many prompts of which
    categories, and (``mt-bench-2``) the first answers the second turns follow."""
    suites = report.get("suites") or {}
    if not suites:
        return ""
    lines = ["", "Suites:"]
    for name, info in suites.items():
        where = f"{info['package']} {info['version']}" if info.get("version") else "a local file"
        src = "generated here, not a public set" if info.get("generated") else f"{where}: `{info['source']}`"
        cats = ", ".join(f"{c} {n}" for c, n in info["categories"].items())
        line = f"- `{name}`: {info['title']}; {info['n']} prompts ({cats}); {src}"
        first = info.get("first_answer")
        if first:
            line += (
                f"; second turns follow the model's own {first['method']} first answers of at most "
                f"{first['max_new_tokens']} new tokens, the same for every row (cached: `{first['cache']}`)"
            )
        if not info.get("scored", True):
            line += "; accuracy not scored (pass@1 runs the rows' code: add run_code=true)"
        lines.append(line)
    return "\n".join(lines) + "\n\n"


def render_categories(report: Mapping[str, Any]) -> str:
    """bench.md's per-category table: every row's tokens per cycle, speedups, agreement with AR and accuracy over
    each category's prompts; empty when no prompt has a category."""
    cats = report.get("categories") or []
    if not cats:
        return ""
    head = ["category", "prompts", "method", "params", "tok/cycle¹", "speedup (total)", "speedup (median)", "= AR²",
            "accuracy"]  # fmt: skip
    lines = [
        "",
        "## By category",
        "",
        *(
            [
                "Sampled rows (T > 0) beside greedy: speedups over the AR row at their temperature, or over greedy `ar` "
                "where marked; = AR for greedy rows only.",
                "",
            ]
            if any(_sampled(r) for r in report["rows"])
            else []
        ),
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---", "---:", "---", "---"] + ["---:"] * (len(head) - 4)) + "|",
    ]
    for cat in cats:
        for r in report["rows"]:
            g = (r.get("by_category") or {}).get(cat["name"])
            if g is None:
                continue
            cells = [
                cat["name"], str(g["n_prompts"]), r["name"], _params(r), _num(g["tokens_per_cycle"]),
                _speedup(r, g["speedup_total"]), _speedup(r, g["speedup_median"]), _agree(r, g["agreement"]),
                _num(None if g["accuracy"] is None else 100 * g["accuracy"], ".1f", "n/a")
                + ("%" if g["accuracy"] is not None else ""),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _depth_table(first: str, lines_in: Sequence[tuple[str, Sequence[Any]]], depths: int) -> list[str]:
    head = [first] + [str(d) for d in range(1, depths + 1)]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * depths) + "|"]
    for label, values in lines_in:
        cells = [_pct(values[i]) if i < len(values) else "" for i in range(depths)]
        out.append("| " + " | ".join([label, *cells]) + " |")
    return out


def _published(depths: int) -> list[float | None]:
    return [PROVE_32B_BY_DEPTH.get(d) for d in range(1, depths + 1)]


def render_acceptance(report: Mapping[str, Any]) -> str:
    """bench.md's acceptance by block position beside ProVe's published 32B curve (only the depths it states;
    – elsewhere), with the trace's "position i matched greedy"; then, with categories, each row's curve by category."""
    rows = [r for r in report["rows"] if r.get("acceptance_by_depth")]
    trace = report.get("trace") or {}
    match = trace.get("match_by_depth") or []
    if not rows and not match:
        return ""
    depths = max([len(r["acceptance_by_depth"]) for r in rows] + [len(match)])
    body: list[tuple[str, Sequence[Any]]] = [(PROVE_32B_LABEL, _published(depths))]
    if match:
        body.append((f"position i matched greedy (trace, K={trace.get('block_size')})", match))
    body += [(f"{r['name']}: accepted", r["acceptance_by_depth"]) for r in rows]
    lines = [
        "",
        "## Acceptance by block position, beside ProVe's published 32B curve",
        "",
        "Accepted: the share of cycles that proposed position i in which the rule accepted it (a leading run). "
        "Matched: the share of proposed positions i whose token equals the target's greedy token after the same "
        "prefix. ProVe's row holds only the points its paper states (depths 1–8 and 16); – = not published."
        + (f" Its depth 16: {100 * PROVE_32B_BY_DEPTH[16]:.0f}%." if depths < 16 else ""),
        "",
        *_depth_table("depth i →", body, depths),
    ]
    cats = [c["name"] for c in report.get("categories") or []]
    for r in rows if cats else []:
        by = r.get("by_category") or {}
        k = len(r["acceptance_by_depth"])
        body = [(PROVE_32B_LABEL, _published(k)), ("all", r["acceptance_by_depth"])]
        body += [(c, by[c]["acceptance_by_depth"]) for c in cats if c in by]
        lines += [
            "",
            f"### {r['name']}: accepted at depth i, by category",
            "",
            *_depth_table("category", body, k),
        ]
    return "\n".join(lines) + "\n"


def _span(start: int, size: int) -> str:
    return f"{start}–{start + size - 1}"


def render_positions(report: Mapping[str, Any]) -> str:
    """bench.md's tokens per cycle by position in the response (first ``position_bin`` tokens, the next, ...): per
    row that commits more than one token a cycle, overall and by category. A cycle counts where it starts."""
    rows = [r for r in report["rows"] if (r.get("by_position") or {}).get("start") and r["method"] != "ar"]
    if not rows:
        return ""
    cats = [c["name"] for c in report.get("categories") or []]
    size = rows[0]["by_position"]["bin_size"]
    lines = [
        "",
        f"## Tokens per cycle by position in the response (bins of {size} tokens)",
        "",
        "A cycle counts in the bin of the response position where it starts; the cell is the mean tokens it "
        "committed (correction / bonus token included).",
    ]
    for r in rows:
        entries = [("all", r["by_position"])]
        entries += [
            (c, r["by_category"][c]["tokens_per_cycle_by_position"])
            for c in cats
            if c in (r.get("by_category") or {})
        ]
        n_bins = max(max(e["start"], default=-size) // size + 1 for _, e in entries)
        head = ["category"] + [_span(b * size, size) for b in range(n_bins)]
        lines += [
            "",
            f"### {r['name']}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * n_bins) + "|",
        ]
        for label, e in entries:
            means = dict(zip(e["start"], e["mean"], strict=True))
            cells = [_num(means.get(b * size), ".2f", "") for b in range(n_bins)]
            lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def _vllm_lossless(row: Mapping[str, Any]) -> bool:
    """Whether a vLLM row's method promises AR's output (its ⚠ below 100%); a lossy one (prove, nsd, asd) does not."""
    from prove.decode.bench.vllm_rows import _lossless

    try:
        return _lossless(row)
    except (KeyError, ValueError):  # a bench.json from before rows carried their params: flag as before
        return True


def _vllm_cells(r: Mapping[str, Any]) -> list[str]:
    agree = f"{100 * r['agreement']:.0f}%" + (" ⚠" if r["agreement"] < 1 and _vllm_lossless(r) else "")
    return [
        r["name"],
        " ".join(param_label(k, v) for k, v in (r.get("params") or {}).items()) or "–",
        str(r["in_flight"]),
        _num(r["tokens_per_s"], ".1f"),
        _num(r.get("vs_vllm_ar")) + ("×" if r.get("vs_vllm_ar") is not None else ""),
        _num(r["mean_acceptance_length"]),
        _num(r["tokens_per_cycle"]),
        agree,
        _num(None if r["accuracy"] is None else 100 * r["accuracy"], ".1f", "n/a")
        + ("%" if r["accuracy"] is not None else ""),
        str(r["preemptions"]) if "preemptions" in r else "–",
    ]


VLLM_FOOTNOTES = [
    "",
    "In flight: requests kept in flight (at most the prompts); tok/s: every prompt's new tokens over the batch's "
    "wall time. ² as above, against our ar.",
    "⁴ vLLM's mean acceptance length, 1 + accepted draft tokens / drafting steps (over the steps that drafted): "
    "vLLM's figure, not our tok/cycle.",
    "⁵ new tokens / engine steps each request took part in (its prefill step included): our tok/cycle's counterpart.",
    "⁷ requests vLLM preempted during the timed run (its KV cache full: freed, recomputed later); the outputs "
    "above are those decoded through the preemptions.",
    "",
]


def _vllm_engine_lines(vllm: Mapping[str, Any]) -> list[str]:
    """Each engine's start-up (and the rows it serves, where several), then where each speculative row stops
    paying."""
    lines = []
    for name, rec in vllm["engines"].items():
        if "skipped" in rec:
            lines.append(f"- {name}: skipped ({rec['skipped']})")
            continue
        served = rec.get("rows") or []  # bench.json before per-request rule rows: one row an engine
        also = (
            f", one engine for {', '.join(served)} (the rule's values per request)" if len(served) > 1 else ""
        )
        lines.append(f"- {name}: engine start-up {rec['startup_s']:.1f} s{also}")
    for name, cross in (vllm.get("crossover") or {}).items():
        if cross is None:
            lines.append(f"- {name} beats vLLM ar at every concurrency of the sweep")
        elif cross["last_win"] is None:
            lines.append(f"- {name} is at or below vLLM ar already at {cross['first_loss']} in flight")
        else:
            lines.append(
                f"- {name} stops paying between {cross['last_win']} and {cross['first_loss']} requests in flight "
                f"(crossover ≈ {cross['estimate']:.1f})"
            )
    return lines


def render_vllm_table(vllm: Mapping[str, Any]) -> str:
    """bench.md's section for vLLM's rows (``backend=vllm``): one line per row (a method at one point of its rule's
    sweep) and concurrency, its engines' start-up (and the rows an engine serves, where several), and where each
    speculative row stops paying."""
    head = [
        "vLLM method", "params", "in flight", "tok/s", "× vLLM ar", "acceptance length⁴", "tok/step⁵", "= AR²",
        "accuracy", "preempted⁷",
    ]  # fmt: skip
    lines = [
        "",
        "## vLLM (backend=vllm): every prompt at each concurrency",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|",
    ]
    lines += ["| " + " | ".join(_vllm_cells(r)) + " |" for r in vllm["rows"]]
    return "\n".join(lines + VLLM_FOOTNOTES + _vllm_engine_lines(vllm)) + "\n"


def render_predicted(predicted: Mapping[str, Any] | None) -> str:
    """bench.md's "Predicted on an H200 (from t(w), not measured)": per greedy row with a cost model, its tokens per
    cycle measured here and the speedup over AR that the committed t(w) curves predict on each shape (bench.json's
    ``predicted``, :mod:`prove.decode.bench.predicted`); empty when no row has one. Never mixed into the measured
    tables above."""
    rows = (predicted or {}).get("rows") or []
    if not rows:
        return ""
    assert predicted is not None
    shapes = list(predicted["curves_ms"])
    labels = predicted["labels"]
    head = ["row", "K / k", "tok/cycle (measured here)", "cycle's passes"]
    head += [f"{labels[s]}: predicted speedup" for s in shapes]
    lines = [
        "",
        f"## Predicted on an {predicted['device'].removeprefix('NVIDIA ')} (from t(w), not measured)",
        "",
        f"t(w) measured {predicted['measured']} ({predicted['source']}; {predicted['conditions']}): "
        + "; ".join(
            f"{labels[s]} "
            + " / ".join(f"t({w}) {ms:g}" for w, ms in predicted["curves_ms"][s].items())
            + " ms"
            for s in shapes
        )
        + ". Predicted speedup = tok/cycle measured here × t(1) / the cycle's passes on that shape (widths between "
        "measured ones interpolated linearly; – beyond the curve). Assumes full proposals (K, or k draft steps) and, "
        "fused, the widest tree (fuse_groups=all's); prove's verifier and the draft rows' draft take the "
        f"{labels[predicted['helper']]}'s t(w) (– on that shape itself). Time outside the passes is not in t(w): "
        "an upper bound. No measured column of this report comes from here.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---", "---", "---:", "---"] + ["---:"] * len(shapes)) + "|",
    ]
    for r in rows:
        cells = [r["name"], r["size"], _num(r["tokens_per_cycle"]), r["passes"]]
        cells += [_num((r["by_shape"].get(s) or {}).get("speedup")) + ("×" if r["by_shape"].get(s) else "")
                  for s in shapes]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def environment(device: Any, dtype: str) -> dict[str, Any]:
    """Versions, hardware and the git commit, for bench.json."""
    import os
    import platform
    import subprocess
    from datetime import datetime

    import torch
    import transformers

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args],
                cwd=Path(__file__).parent,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no")
    dev = torch.device(device)
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name(),
        "dtype": dtype,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def render_pass_cost(cost: Mapping[str, Any], per_line: int = 10) -> str:
    """bench.md's section for ``pass_cost``: t(w)/t(1), ``per_line`` widths a table row."""
    widths, ratio = cost["widths"], cost["ratio"]
    head = ["w"] + [f"+{i}" for i in range(per_line)]
    lines = [
        "",
        f"## Pass cost t(w)/t(1): one pass feeding w tokens after {cost['context']} cached ones",
        "",
        f"t(1) = {cost['ms'][0]:.2f} ms through the fused pass's masked path ({cost['plain_t1_ms']:.2f} ms as a "
        f"plain AR step); fastest of {cost['repeats']}. A fused pass with all groups is k + 1 + (k+1)(K−1) wide.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---:"] * len(head)) + "|",
    ]
    for lo in range(0, len(widths), per_line):
        cells = [str(widths[lo])] + [f"{r:.2f}" for r in ratio[lo : lo + per_line]]
        cells += [""] * (len(head) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], output_dir: str | Path, *, plots: bool = True) -> dict[str, Any]:
    """Write bench.json, bench.md (and print it) and, if asked, the plots; returns the report."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        from prove.decode.bench.plots import write_plots

        report["plots"] = {k: str(v) for k, v in write_plots(report, out).items()}
    table = render_table(report["rows"], report.get("greedy_only"))
    header = _md_header(report)
    cost = report.get("pass_cost")
    vllm = report.get("vllm")
    (out / "bench.md").write_text(
        header
        + render_suites(report)
        + table
        + render_categories(report)
        + render_acceptance(report)
        + render_positions(report)
        + render_predicted(report.get("predicted"))
        + render_quality_table(report["rows"])
        + (render_vllm_table(vllm) if vllm else "")
        + (render_pass_cost(cost) if cost else "")
    )
    (out / "bench.json").write_text(json.dumps(_jsonable(report), indent=1, ensure_ascii=False) + "\n")
    return report


def _md_header(report: Mapping[str, Any]) -> str:
    env = report["env"]
    lines = [
        f"# prove-bench — {report['prompts']['n']} prompts{_suite_title(report)}, {env['device']} ({env['device_name']}), {env['dtype']}",
        "",
        f"model `{report['models']['model']}`, verifier `{report['models']['verifier']}`, "
        f"draft `{report['models']['draft']}`; torch {env['torch']}, transformers {env['transformers']}, "
        f"commit {(env['git_commit'] or 'n/a')[:10]}{' (dirty)' if env.get('git_dirty') else ''}",
        "",
    ]
    hfc = report.get("hf_compare")
    if hfc:
        pairs = "; ".join(
            f"{k.replace('_vs_', ' vs ')}: {v['median']:.2f}× (median), {v['total']:.2f}× (total), tokens "
            + ("identical" if v["identical"] else "DIFFER ⚠")
            for k, v in hfc.items()
            if isinstance(v, dict)
        )
        lines += [f"hf_compare ({hfc['shape']} shape, {hfc['draft_layers']}-layer draft): {pairs}", ""]
    trace = report.get("trace") or {}
    if trace.get("roc"):
        aucs = ", ".join(
            f"{k.replace('p_tilde_q', 'p̃·q').replace('p_tilde', 'p̃')} {v['auc']:.3f}"
            for k, v in trace["roc"].items()
        )
        lines += [
            f'AUC for predicting "matches greedy" (K={trace["block_size"]}, {trace["positions"]} positions): {aucs}',
            "",
        ]
    return "\n".join(lines)


def _suite_title(report: Mapping[str, Any]) -> str:
    names = (report.get("prompts") or {}).get("suite")
    return f" of {', '.join(names)}" if names else ""


def _jsonable(x: Any) -> Any:
    """NaN / inf → None (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
