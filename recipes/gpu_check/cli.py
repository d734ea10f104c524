"""``python -m prove.recipes.gpu_check``: the arguments, the run (parts → prediction → report) and its exit status."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prove.recipes.gpu_check.config import (
    ALL_PARTS,
    PARTS,
    PIPELINE_STAGES,
    SCHEMA,
    SHAPES,
    CheckConfig,
    tiny_config,
)
from prove.recipes.gpu_check.curve import run_curve
from prove.recipes.gpu_check.decoding import run_decode
from prove.recipes.gpu_check.engine import run_engine
from prove.recipes.gpu_check.pipeline import run_pipeline
from prove.recipes.gpu_check.predict import (
    curve_widths,
    load_acceptance,
    predict,
    prediction_widths,
    predictor_check,
)
from prove.recipes.gpu_check.report import render_md, write_plot
from prove.recipes.gpu_check.runtime import check_entry, describe_error
from prove.recipes.gpu_check.training import run_train

PART_RUNNERS = (
    ("train", run_train),
    ("decode", run_decode),
    ("curve", run_curve),
    ("engine", run_engine),
    ("pipeline", run_pipeline),
)


def run(cfg: CheckConfig) -> dict[str, Any]:
    """Run the parts, write gpu-check.json / .md / cost_curve.png to ``cfg.out``; returns the report."""
    import torch

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    acceptance = load_acceptance(cfg.acceptance)  # a bad --acceptance fails before any model is built
    acc = {m: v["acceptance_by_depth"] for m, v in acceptance["methods"].items()}
    # the curve times every width the prediction will read (the fused tree of the largest K may lie beyond it)
    ladder = tuple(sorted(set(cfg.widths)))
    cfg = dataclasses.replace(cfg, widths=curve_widths(ladder, prediction_widths(acc, cfg.sd_k)))
    added = sorted(set(cfg.widths) - set(ladder))
    checks: list[dict[str, Any]] = []
    report = new_report(cfg, checks)
    run_parts(cfg, report, checks)
    curve = report.get("curve")
    if curve and curve["ms"]:
        report["prediction"] = prediction(cfg, acceptance, curve, ladder, added)
        report["predictor_check"] = predictor_check(report.get("decode"), curve)
        report["plot"], report["plot_note"] = write_plot(curve, out)
    report["wall_s"] = time.perf_counter() - t0
    report["ok"] = all(c["ok"] for c in checks)
    write_report(report, out)
    return report


def new_report(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The report before any part ran: the schema, the config, the environment, and the (shared) checks list."""
    import torch
    from prove.decode.bench.report import environment

    return {
        "schema": SCHEMA,
        "tiny": cfg.tiny,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
        "env": environment(cfg.device, "mixed"),
        "cuda": torch.version.cuda if torch.device(cfg.device).type == "cuda" else None,
        "checks": checks,
    }


def run_parts(cfg: CheckConfig, report: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    """Each part of ``cfg.parts`` in order, its result under its name; a part that raises is a failed check and
    the next still runs."""
    for part, fn in PART_RUNNERS:
        if part not in cfg.parts:
            continue
        print(f"gpu-check: {part} …", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            report[part] = fn(cfg, checks)
        except Exception as e:
            checks.append(check_entry(f"{part}: ran", False, describe_error(e)))
        print(f"gpu-check: {part} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)


def prediction(
    cfg: CheckConfig,
    acceptance: dict[str, Any],
    curve: dict[str, Any],
    ladder: tuple[int, ...],
    added: list[int],
) -> dict[str, Any]:
    """Each method's predicted speedup over AR from the measured t(w) and the acceptance's per-depth rates, with
    the note that says what it leaves out (and which widths the curve timed for it beyond the ladder)."""
    curves = {s: {int(w): t for w, t in c.items()} for s, c in curve["ms"].items()}
    acc = {m: v["acceptance_by_depth"] for m, v in acceptance["methods"].items()}
    timed_too = (
        f" The curve also timed w = {', '.join(map(str, added))}: widths this prediction reads beyond {ladder[-1]}."
        if added
        else ""
    )
    return {
        "source": acceptance.get("source", "?"),
        "acceptance": acceptance["methods"],
        "draft": cfg.draft_shape,
        "verifier": cfg.verifier_shape,
        "widths_added": added,
        "note": (
            f"prove uses a {cfg.verifier_shape}-shaped verifier, sd a {cfg.draft_shape}-shaped draft at "
            f"k = {cfg.sd_k}. Fused = one pass per cycle of the widest fused tree, fuse_groups=all with the "
            "second candidate ((K + 3)(K − 1) + 2 entries: 79 at K = 8, 287 at K = 16). The acceptance "
            "rates decide everything: pass `--acceptance bench.json` from `prove-bench` on your own model "
            "and task. Host overhead per cycle is not counted, and tokens/cycle is the steady state of long "
            "outputs (a response's EOS cuts its last cycle short): both make this an upper bound." + timed_too
        ),
        "rows": predict(
            curves,
            acc,
            draft=cfg.draft_shape,
            verifier=cfg.verifier_shape,
            sd_k=cfg.sd_k,
            sizes=curve["param_bytes"],
        ),
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    """gpu-check.json (the report as data) and gpu-check.md (:func:`render_md` of the same dict)."""
    from prove.decode.bench.report import _jsonable

    (out / "gpu-check.json").write_text(json.dumps(_jsonable(report), indent=1, ensure_ascii=False) + "\n")
    (out / "gpu-check.md").write_text(render_md(report))


def argument_parser() -> argparse.ArgumentParser:
    """The command line: every option maps onto a :class:`CheckConfig` field (:func:`parse_args`)."""
    ap = argparse.ArgumentParser(
        prog="python -m prove.recipes.gpu_check",
        description="Prove the GPU path (bf16 MARS training with FlexAttention, CUDA decoding) and measure the "
        "pass cost curve t(w) that decides each method's speed; writes gpu-check.json/.md and cost_curve.png.",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="tiny shapes on CPU in seconds (the test suite's smoke run)"
    )
    ap.add_argument("--device", default=None, help="torch device (default cuda; cpu with --tiny)")
    ap.add_argument("--out", default="outputs/gpu-check", help="output folder (default outputs/gpu-check)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(ALL_PARTS)} "
                    f"(default {','.join(PARTS)}; pipeline: the whole job through make)")  # fmt: skip
    ap.add_argument("--from-stage", default=None, help=f"pipeline: rerun from this stage of {','.join(PIPELINE_STAGES)}"
                    " (the earlier ones read back from the last run's state.json)")  # fmt: skip
    ap.add_argument(
        "--shapes", default=None, help=f"cost-curve shapes, comma-separated, of {', '.join(SHAPES)}"
    )
    ap.add_argument(
        "--widths",
        default=None,
        help="cost-curve widths, e.g. 1,2,4,8,16,32,64,128,256 (the widths the prediction reads beyond them "
        "are timed too)",
    )
    ap.add_argument(
        "--cache-len", type=int, default=None, help="warm KV cache length of the cost curve (512)"
    )
    ap.add_argument(
        "--methods", default=None, help="decode rows to run (default all), e.g. ar,prove-lossless,sd"
    )
    ap.add_argument("--acceptance", default=None, help="a prove-bench bench.json whose per-depth acceptance "
                    "the prediction uses (default: the tiny demo's, gpu_check_acceptance.json)")  # fmt: skip
    ap.add_argument("--engine-shapes", default=None, help="the engine part's shapes, comma-separated "
                    "(default qwen2.5-0.5b,qwen2.5-7b,qwen2.5-32b)")  # fmt: skip
    ap.add_argument("--engine-hf-compile", default=None, help="shapes that also run transformers' compiled "
                    "static-cache generate (default qwen2.5-0.5b,qwen2.5-7b: the 32B compile takes minutes)")  # fmt: skip
    ap.add_argument("--engine-compile", default=None, help="shapes whose fast rows also run with compile=true "
                    "(inductor before the graph capture; default qwen2.5-7b; empty: none)")  # fmt: skip
    ap.add_argument("--no-flex", action="store_true", help="train with the dense mask only")
    ap.add_argument(
        "--flex", action="store_true", help="with --tiny: also run the FlexAttention path (compiles on CPU)"
    )
    return ap


def _names(csv: str) -> tuple[str, ...]:
    return tuple(s for s in csv.split(",") if s)


def parse_args(argv: Sequence[str] | None) -> CheckConfig:
    """The config the command line asks for: the tiny CPU one with ``--tiny``, else the real check's."""
    args = argument_parser().parse_args(argv)
    kw: dict[str, Any] = {"out": args.out, "parts": _names(args.parts)}
    if args.device:
        kw["device"] = args.device
    if args.shapes:
        kw["shapes"] = _names(args.shapes)
    if args.widths:
        kw["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.cache_len:
        kw["cache_len"] = args.cache_len
    if args.methods:
        kw["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.acceptance:
        kw["acceptance"] = args.acceptance
    if args.engine_shapes:
        kw["engine_shapes"] = _names(args.engine_shapes)
    if args.engine_hf_compile is not None:
        kw["engine_hf_compile_shapes"] = _names(args.engine_hf_compile)
    if args.engine_compile is not None:
        kw["engine_compile_shapes"] = _names(args.engine_compile)
    if args.from_stage:
        kw["pipeline_from"] = args.from_stage
    if args.no_flex:
        kw["flex"] = False
    if args.tiny and args.flex:
        kw.update(flex=True, dense_attn="sdpa")
    return tiny_config(**kw) if args.tiny else CheckConfig(**kw)


def main(argv: Sequence[str] | None = None) -> int:
    """0: every check passed; 1: a check failed (the report is still written); 2: bad arguments or no CUDA."""
    try:
        cfg = parse_args(argv)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    import torch

    if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False): "
            "run it on a machine with a GPU, or pass --tiny for the CPU smoke run",
            file=sys.stderr,
        )
        return 2
    try:
        report = run(cfg)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    print((Path(cfg.out) / "gpu-check.md").read_text())
    failed = [c["check"] for c in report["checks"] if not c["ok"]]
    print(f"gpu-check: {len(report['checks']) - len(failed)}/{len(report['checks'])} checks passed; "
          f"report in {cfg.out}/gpu-check.md", file=sys.stderr)  # fmt: skip
    return 0 if not failed else 1
