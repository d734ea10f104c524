"""The report a run leaves: ``gpu-check.md`` (:func:`render_md`, from the same dict as ``gpu-check.json``) and
``cost_curve.png`` (:func:`write_plot`; skipped, with a note, without matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _f(v: Any, spec: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return format(v, spec)


def render_md(report: Mapping[str, Any]) -> str:
    """gpu-check.md: the checks, then a section per part that ran, the prediction and the predictor check."""
    lines = render_header(report)
    lines += render_train(report.get("train"))
    lines += render_decode(report.get("decode"), report["env"]["device"])
    lines += render_curve(report.get("curve"))
    lines += render_prediction(report.get("prediction"))
    lines += render_predictor_check(report.get("predictor_check"))
    lines += render_engine(report.get("engine"), report.get("curve"))
    lines += render_pipeline(report.get("pipeline"))
    if report.get("plot_note"):
        lines += ["", report["plot_note"]]
    return "\n".join(lines) + "\n"


def render_header(report: Mapping[str, Any]) -> list[str]:
    """The title (device, and whether it was the tiny CPU run), the versions and commit, then the checks."""
    env = report["env"]
    lines = [
        f"# gpu-check — {env['device_name']} ({env['device']})"
        + (" — tiny CPU smoke run" if report["tiny"] else ""),
        "",
        f"torch {env['torch']}, transformers {env['transformers']}, CUDA {report.get('cuda') or '–'}, "
        f"{env['time_utc']}, commit {(env.get('git_commit') or 'n/a')[:10]}; {report['wall_s']:.0f} s in all.",
        "",
        "## Checks",
        "",
    ]
    lines += [f"- {'✅' if c['ok'] else '❌'} {c['check']}" + (f" — `{c['error']}`" if "error" in c else "")
              for c in report["checks"]]  # fmt: skip
    return lines


def render_train(train: Mapping[str, Any] | None) -> list[str]:
    """Part 1's section: a row per attention implementation's MARS step, the plain step's row, their ratio."""
    if not train:
        return []
    lines = ["", f"## 1. Training path: MARS, {train['shape']}, {train['dtype']}, batch {train['batch']} × "
                 f"{train['length']} tokens (the model reads 2 × {train['length']}), K = {train['block_size']}",
             "", "| attention | mask | loss step 1 | loss last | tokens/s | step ms | first step ms | peak GiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [train_table_row(r, "error") for r in train["runs"].values()]
    if plain := train.get("plain"):
        lines.append(train_table_row(plain, "plain step error"))
    if train.get("mars_over_plain"):
        ratios = ", ".join(f"{impl} {x:.2f}×" for impl, x in train["mars_over_plain"].items())
        lines += ["", f"MARS step / plain causal-LM step on the same rows (step ms): {ratios}."]
    if train.get("note"):
        lines += ["", train["note"]]
    return lines


def train_table_row(r: Mapping[str, Any], failed: str) -> str:
    """One training run's table row, or its error under ``failed``."""
    if "error" in r:
        return f"| {r['attn_implementation']} | {failed}: {r['error']} | | | | | | |"
    return (
        f"| {r['attn_implementation']} | {r['mask']} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} | "
        f"{r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | {r['first_step_ms']:.0f} | {_f(r['peak_gib'])} |"
    )


def render_decode(dec: Mapping[str, Any] | None, device: str) -> list[str]:
    """Part 2's section: per dtype, a row per method (agreement with generate, acceptance, speedup)."""
    if not dec:
        return []
    lines = ["", f"## 2. Decoding on {device}: random {dec['shape']} (weight std {dec['weight_std']}), "
                 f"draft = its first {dec['draft_layers']} layers, K = {dec['block_size']}, k = {dec['k']}"]  # fmt: skip
    for dt, d in dec["dtypes"].items():
        lines += ["", f"### {dt}: {d['prompts']} prompts × {d['new_tokens']} tokens "
                      f"({d['distinct_reference_tokens']} distinct tokens in the reference)", "",
                  "| method | = generate | first div. | tok/cycle | model passes/tok | accepted by depth | speedup vs ar "
                  "| path |",
                  "|---|---:|---|---:|---:|---|---:|---|"]  # fmt: skip
        lines += [decode_table_row(name, r) for name, r in d["rows"].items() if name != "hf-greedy"]
    return lines


def decode_table_row(name: str, r: Mapping[str, Any]) -> str:
    """One method's decoding row: a lossless method's agreement with generate and first divergences, a greedy lossy
    one's agreement with our fp32 reference path, a sampling one's neither."""
    if "error" in r:
        return f"| {name} | error: {r['error']} | | | | | | |"
    agree = f"{r['agreement']:.0%}" if r["lossless"] else "(sampling)"
    if "agreement_with_reference" in r:
        agree = f"{r['agreement_with_reference']:.0%} = ours, fast=false"
    acc = " ".join(_f(v) for v in r["acceptance_by_depth"]) or "–"
    divs = ",".join("–" if v is None else str(v) for v in r["first_divergence"]) if r["lossless"] else ""
    return (
        f"| {name} | {agree} | {divs} | {r['tokens_per_cycle']:.2f} | {r['model_passes_per_token']:.2f} | "
        f"{acc} | {_f(r.get('speedup_vs_ar'))}× | {r.get('path', '')} |"
    )


def render_curve(curve: Mapping[str, Any] | None) -> list[str]:
    """Part 3's section: ms per pass of w tokens by shape, with t(64)/t(1); the shapes skipped or failed."""
    if not curve:
        return []
    widths = sorted({int(w) for c in curve["ms"].values() for w in c})
    lines = ["", f"## 3. Cost curve: ms per pass of w tokens on a warm cache of {curve['cache_len']} "
                 f"({curve['dtype']}, median of {curve['repeats']} after {curve['warmup']} warm-up)", "",
             "| shape | " + " | ".join(f"w={w}" for w in widths) + " | t(64)/t(1) |",
             "|---|" + "---:|" * (len(widths) + 1)]  # fmt: skip
    for shape, c in curve["ms"].items():
        ratio = c.get("64", math.nan) / c["1"] if "1" in c else math.nan
        lines.append(f"| {shape} | " + " | ".join(_f(c.get(str(w))) for w in widths) + f" | {_f(ratio)} |")
    for shape, why in curve["skipped"].items():
        lines += ["", f"**{shape} skipped**: {why}."]
    for shape, why in curve["errors"].items():
        lines += ["", f"**{shape} failed**: `{why}`."]
    return lines


def render_prediction(pred: Mapping[str, Any] | None) -> list[str]:
    """The predicted speedups over AR, from t(w) and a source's per-depth acceptance."""
    if not pred:
        return []
    lines = ["", f"## Predicted speedup over AR (from t(w) and the per-depth acceptance of {pred['source']})", "",
             pred["note"], "", "| target | method | size | tokens/cycle | passes per cycle | cycle ms | speedup |",
             "|---|---|---|---:|---|---:|---:|"]  # fmt: skip
    for r in pred["rows"]:
        lines.append(
            f"| {r['target']} | {r['method']} | {r['size']} | {r['tokens_per_cycle']:.2f} | {r['passes']} | "
            f"{r['cycle_ms']:.2f} | **{r['speedup']:.2f}×** |"
        )
    return lines


def render_predictor_check(pc: Mapping[str, Any] | None) -> list[str]:
    """One paragraph: the speedup t(w) predicts for prove-lossless beside the one the decode part measured."""
    if not pc:
        return []
    return ["", f"Predictor check — prove-lossless K = {pc['block_size']} on the decode model ({pc['shape']}, "
                f"{pc['dtype']}, {pc['tokens_per_cycle_measured']:.2f} tokens/cycle): predicted from t(w) "
                f"{pc['predicted']:.2f}×, measured {pc['measured']:.2f}× over ar (the gap is the engine's "
                "per-cycle host work, which t(w) leaves out)."]  # fmt: skip


def render_engine(engine: Mapping[str, Any] | None, curve: Mapping[str, Any] | None) -> list[str]:
    """Part 4's section: per shape, the rows against transformers, then the graph-mode t(w) beside part 3's."""
    if not engine:
        return []
    lines = ["", f"## 4. Engine against transformers: {engine['dtype']}, one request, {engine['new_tokens']} new "
                 f"tokens, K = {engine['block_size']}", "", engine["note"]]  # fmt: skip
    for shape, d in engine["shapes"].items():
        if "rows" not in d:
            lines += ["", f"**{shape}**: {d.get('skipped') or d.get('error')}"]
            continue
        lines += ["", f"### {shape}", "",
                  "| row | path | tok/s | vs transformers compiled AR | tok/cycle | host ms/cycle | GPU ms/cycle | "
                  "syncs/cycle | replays/cycle | captures | = transformers |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for name, r in d["rows"].items():
            if "error" in r:
                lines.append(f"| {name} | error: `{r['error']}` | | | | | | | | | |")
                continue
            agree = r.get("agree_with_transformers")
            lines.append(
                f"| {name} | {r.get('path', 'transformers')} | {_f(r.get('tok_s'), '.1f')} | "
                f"{_f(r.get('vs_transformers_compiled_ar'))} | {_f(r.get('tokens_per_cycle'))} | "
                f"{_f(r.get('host_ms_per_cycle'))} | {_f(r.get('gpu_ms_per_cycle'))} | {_f(r.get('syncs_per_cycle'))} | "
                f"{_f(r.get('graph_replays_per_cycle'))} | {r.get('graph_captures', '–')} | "
                f"{'–' if agree is None else ('yes' if agree else 'no')} |"
            )
        eager = (curve or {}).get("ms", {}).get(shape, {})
        g = d["graph_curve_ms"]
        if "error" in g:
            lines += ["", f"t(w) in graph mode: {g['error']}"]
            continue
        mode = "a CUDA graph replayed" if engine.get("graphs") else "eager (no CUDA graphs off CUDA)"
        lines += ["", f"t(w), ms per pass on a warm cache: the slot cache's pass ({mode}) beside part 3's engine pass",
                  "", "| w | slot cache | part 3 |", "|---:|---:|---:|"]  # fmt: skip
        for w in sorted(int(k) for k in g):
            lines.append(f"| {w} | {_f(g.get(w, g.get(str(w))))} | {_f(eager.get(str(w), eager.get(w)))} |")
    return lines


def render_pipeline(pipeline: Mapping[str, Any] | None) -> list[str]:
    """Part 5's section: one row per stage (wall time, s/step, tokens/s, peak memory), MARS's resume, the bench."""
    if not pipeline:
        return []
    stages = pipeline["stages"]
    shape = pipeline["settings"]["shape"]
    lines = ["", f"## 5. Pipeline: the whole job through make (a {shape['layers']}-layer, hidden {shape['hidden']} "
                 "body with random weights, the tiny recipe's tokenizer, deepspeed=zero3)"
             + (f", from stage {pipeline['from_stage']}" if pipeline.get("from_stage") else ""), "",
             "| stage | ok | wall s | first step s | s/step after it | tokens/s | peak GPU GiB | peak RSS GiB | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, s in stages.items():
        note = s.get("error") or ""
        if name == "mars" and s.get("resumed_from_step") is not None:
            note = f"killed after checkpoint {s['first_launch']['killed_after_checkpoints']}, resumed at step " \
                   f"{s['resumed_from_step']}, finished at {s['final_step']}"  # fmt: skip
        if name == "cpu-adam" and not s.get("error"):
            note = (
                "torch AdamW on the offload path (--tiny)"
                if s.get("torch_adam")
                else "DeepSpeed CPU Adam built"
            )
        lines.append(
            f"| {name} | {'✅' if s['ok'] else '❌'} | {_f(s.get('wall_s'), '.0f')} | {_f(s.get('first_step_s'))} | "
            f"{_f(s.get('s_per_step'), '.3f')} | "
            f"{_f(s.get('tokens_per_s'), '.0f')} | {_f(s.get('peak_gib'))} | {_f(s.get('peak_rss_gib'))} | {note} |"
        )
    for dtype, b in (stages.get("bench") or {}).items():  # float32, bfloat16 (and its wall_s, a number)
        if not isinstance(b, dict) or "rows" not in b:
            continue
        lines += ["", f"prove-bench, {dtype}:", "", "| row | = ar | tokens/s | tokens/cycle | speedup |",
                  "|---|---:|---:|---:|---:|"]  # fmt: skip
        for name, r in b["rows"].items():
            lines.append(f"| {name} | {_f(r.get('agreement'), '.0%')} | {_f(r.get('tokens_per_s'), '.0f')} | "
                         f"{_f(r.get('tokens_per_cycle'))} | {_f(r.get('speedup_total'))}× |")  # fmt: skip
    lines += ["", f"Every launch's output: `{pipeline['log']}`."]
    return lines


def write_plot(curve: Mapping[str, Any], out: Path) -> tuple[str | None, str | None]:
    """cost_curve.png: t(w) and t(w)/t(1) per shape; (path, None), or (None, why) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed: no cost_curve.png (the numbers are in the table above)."
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for shape, c in curve["ms"].items():
        ws = sorted(int(w) for w in c)
        ts = [c[str(w)] for w in ws]
        ax1.plot(ws, ts, marker="o", label=shape)
        ax2.plot(ws, [t / c["1"] for t in ts], marker="o", label=shape)
    for ax, ylabel in ((ax1, "ms per pass"), (ax2, "t(w) / t(1)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"w (tokens per pass, cache {curve['cache_len']})")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    fig.suptitle(f"forward-pass cost vs width ({curve['dtype']})")
    fig.tight_layout()
    path = out / "cost_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path), None
