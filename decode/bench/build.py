"""bench.json's content from the timed runs (:func:`build_report`): one record per row, each against its speedup
reference (greedy rows: ``ar``; a sampled row: the AR row at its temperature where one ran, else greedy ``ar``,
:func:`speedup_references`), the inputs, the environment, and the H200 prediction (:mod:`.predicted`).

This module imports neither torch nor transformers at import time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prove.decode.bench.hf_compare import hf_compare_report
from prove.decode.bench.metrics import (
    PromptRun,
    summarize,
    summarize_groups,
    tokens_per_cycle_by_position,
)
from prove.decode.bench.quality import TokenScores, quality_summary
from prove.decode.bench.report import SCHEMA, environment
from prove.decode.bench.rows import ONLY_WITH, REFERENCE, HFRow, RowSpec, is_lossless

if TYPE_CHECKING:
    from prove.decode.bench.config import BenchConfig
    from prove.decode.decoder import Decoder


@dataclasses.dataclass
class Inputs:
    """What every row decodes: the prompts, their keys (JSONL ids) and answers, and the shared models."""

    keys: list[Any]
    prompts: list[Any]
    """Token ids once ``run_bench`` has encoded them (text or chat messages before)."""
    answers: list[str | None]
    models: dict[str, Any]
    groups: list[str | None] = dataclasses.field(default_factory=list)
    """Each prompt's category (``suite/category`` for a named suite's; :func:`group_key`), None = none."""
    checks: list[Callable[[str], bool] | None] | None = None
    """Each prompt's accuracy check (a named suite's: pass@1, the answer), None where not scored; None: the
    prompt file's ``answer`` fields with the default scorer."""
    suites: dict[str, dict[str, Any]] | None = None
    """Where each named suite came from (bench.json's ``suites``)."""


SAMPLING_DEFAULTS = {"top_p": 1.0, "top_k": 0}
"""A sampled row's params show top-p / top-k only where they differ from these (off)."""


def sampling_of(decoder: Any) -> dict[str, Any] | None:
    """A row's sampling parameters (temperature, top_p, top_k) when it samples (temperature > 0), else None
    (greedy; transformers' rows, which have no ``params``)."""
    params = getattr(decoder, "params", None)
    if params is None or not getattr(params, "temperature", 0):
        return None
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}


def speedup_references(specs: Sequence[RowSpec], decoders: Mapping[str, Any]) -> dict[str, str]:
    """Each of our rows' speedup reference: greedy rows (and sampled AR rows) ``ar``; a sampled row the AR row with
    the same temperature, top-p and top-k where one ran, else greedy ``ar`` (its record says which)."""
    ar_by_sampling: dict[tuple[Any, ...], str] = {}
    for s in specs:
        sampling = sampling_of(decoders[s.name])
        if s.method == REFERENCE and sampling is not None:
            ar_by_sampling.setdefault(tuple(sampling.values()), s.name)
    out = {}
    for s in specs:
        sampling = sampling_of(decoders[s.name])
        same = (
            None
            if sampling is None or s.method == REFERENCE
            else ar_by_sampling.get(tuple(sampling.values()))
        )
        out[s.name] = same or REFERENCE
    return out


def resolved_params(decoder: Decoder) -> dict[str, Any]:
    """The values a row ran with, of the parameters its method reads (defaults included), and its sampling ones
    where it samples (top-p / top-k only where on)."""
    params = {k: getattr(decoder.params, k) for k in decoder.method.uses}
    for k, parent in ONLY_WITH.items():  # e.g. unfused: neither fuse nor fuse_groups says anything
        if parent in params and not params.get(parent):
            params.pop(k, None)
            params.pop(parent, None)
    sampling = sampling_of(decoder)
    if sampling is not None:
        params.update({k: v for k, v in sampling.items() if SAMPLING_DEFAULTS.get(k) != v})
    return params


def _cost_record(decoder: Decoder) -> dict[str, Any] | None:
    """``fuse_groups=auto``: the pass-cost curve its Decoder measured at start-up and planned every tree with
    (milliseconds by width, and the fitted line), so a row's speed can be read against what auto saw; else None."""
    from prove.decode.engine.fused import CostCurve

    curve = getattr(decoder.proposer, "cost", None)
    if not isinstance(curve, CostCurve):
        return None
    a, b = curve.line
    return {
        "widths": list(curve.widths),
        "ms": [1000 * t for t in curve.seconds],
        "line_ms": {"intercept": 1000 * a, "per_entry": 1000 * b},
    }


def row_summary(
    cfg: BenchConfig,
    row_runs: Sequence[PromptRun],
    reference: Sequence[PromptRun],
    inputs: Inputs,
    checks: Sequence[Callable[[str], bool] | None] | None,
) -> dict[str, Any]:
    """A row's numbers against its reference (:func:`summarize`), tokens per cycle by response position, and by
    category where the prompts have categories."""
    summary = summarize(row_runs, reference, checks=checks, bin_size=cfg.bin_size)
    starts, means, counts = tokens_per_cycle_by_position(
        (r.committed_per_cycle for r in row_runs), cfg.position_bin
    )
    summary["by_position"] = {"bin_size": cfg.position_bin, "start": starts, "mean": means, "cycles": counts}
    if any(g is not None for g in inputs.groups):
        summary["by_category"] = summarize_groups(
            row_runs, reference, inputs.groups, checks=checks, bin_size=cfg.position_bin
        )
    return summary


def _per_prompt(row_runs: Sequence[PromptRun], divergence: Sequence[int | None]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.id,
            "new_tokens": r.new_tokens,
            "cycles": r.cycles,
            "wall_s": r.wall_s,
            "first_divergence": d,
            "text": r.text,
        }
        for r, d in zip(row_runs, divergence, strict=True)
    ]


def _row_identity(
    name: str, spec: RowSpec | None, decoder: Any, hf_rows: Mapping[str, HFRow] | None, cfg: BenchConfig
) -> dict[str, Any]:
    """A row's name, method, parameters, whether it must reproduce AR (greedy rows only), which path ran, and for
    a sampled row its sampling values and seed."""
    if spec is None:  # a transformers row: greedy, lossless
        return {"name": name, "method": name, "params": (hf_rows or {})[name].params, "swept": {},
                "lossless": True, "temperature": 0.0, "path": name}  # fmt: skip
    params = resolved_params(decoder)
    sampling = sampling_of(decoder)
    record = {
        "name": name,
        "method": spec.method,
        "params": params,
        "swept": dict(spec.params),
        "lossless": sampling is None and is_lossless(spec.method, params),
        "temperature": 0.0 if sampling is None else sampling["temperature"],
        "path": "fast" if getattr(decoder, "fast_engine", None) else "reference",
    }
    if sampling is not None:
        record["sampling"] = {**sampling, "seed": cfg.seed, "seeds": "seed + prompt index"}
    return record


def row_record(
    cfg: BenchConfig,
    name: str,
    spec: RowSpec | None,
    decoders: Mapping[str, Decoder],
    runs: Mapping[str, list[PromptRun]],
    inputs: Inputs,
    reference: str,
    hf_rows: Mapping[str, HFRow] | None,
    quality: Mapping[str, list[TokenScores]] | None,
) -> dict[str, Any]:
    """One row of bench.json: who it is, its numbers against ``reference`` (a row name), its per-prompt records."""
    row_runs = runs[name]
    summary = row_summary(cfg, row_runs, runs[reference], inputs, accuracy_checks(inputs))
    decoder = decoders[name] if spec else None
    record = _row_identity(name, spec, decoder, hf_rows, cfg)
    record["speedup_over"] = reference
    record.update(summary)
    fuse_cost = _cost_record(decoder) if decoder is not None else None
    if fuse_cost:
        record["fuse_cost"] = fuse_cost
    if decoder is not None and getattr(decoder, "pad_plans", None):
        record["pad_plans"] = {k: v.record() for k, v in decoder.pad_plans.items()}
    if quality:
        record["quality"] = quality_summary(
            quality[name], quality[REFERENCE], [r.token_ids for r in row_runs]
        )
    record["per_prompt"] = _per_prompt(row_runs, summary["first_divergence"])
    return record


def build_report(
    cfg: BenchConfig,
    specs: Sequence[RowSpec],
    decoders: Mapping[str, Decoder],
    runs: Mapping[str, list[PromptRun]],
    inputs: Inputs,
    trace: dict[str, Any] | None,
    cost: dict[str, Any] | None,
    hf_rows: Mapping[str, HFRow] | None = None,
    vllm: dict[str, Any] | None = None,
    quality: Mapping[str, list[TokenScores]] | None = None,
) -> dict[str, Any]:
    """bench.json's content: one summary per row (with its per-prompt records and, with ``quality``, its
    :func:`quality_summary` against AR), the environment, the inputs, vLLM's rows (``vllm``, ``backend=vllm``), the
    greedy-only methods a temperature sweep gave no sampled row, and the H200 prediction (``predicted``)."""
    from prove.decode.bench.predicted import predicted_section

    spec_by_name = {s.name: s for s in specs}
    refs = speedup_references(specs, decoders)
    rows = [
        row_record(cfg, name, spec_by_name.get(name), decoders, runs, inputs, refs.get(name, REFERENCE),
                   hf_rows, quality)
        for name in runs
    ]  # fmt: skip
    report = _report_frame(cfg, inputs, rows)
    report.update(
        {
            "lossless_violations": [r["name"] for r in rows if r["lossless"] and r["agreement"] < 1]
            + (vllm["violations"] if vllm else []),
            "trace": trace,
            "vllm": vllm,
            "pass_cost": cost,
            "predicted": predicted_section(rows),
            "plots": {},
        }
    )
    if cfg.hf_compare is not None:
        report.update(hf_compare_report(cfg, runs, len(inputs.prompts), specs))
    return report


def _report_frame(cfg: BenchConfig, inputs: Inputs, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """bench.json's header: schema, environment, config, models, prompts, suites, categories, sampling, rows."""
    from prove.decode.bench.rows import greedy_only_skips
    from prove.decode.methods import METHODS

    checks = accuracy_checks(inputs)
    greedy_only = {n for n, m in METHODS.items() if m.greedy_only}
    return {
        "schema": SCHEMA,
        "env": environment(cfg.device, cfg.dtype),
        "config": dataclasses.asdict(cfg),
        "models": {"model": cfg.model, "verifier": cfg.verifier, "draft": cfg.draft},
        "prompts": {
            "path": None if cfg.prompts is None else str(cfg.prompts),
            "suite": None if not cfg.suite else list(inputs.suites or {}),
            "n": len(inputs.prompts),
            "with_answers": sum(c is not None for c in checks) if checks is not None else 0,
        },
        "suites": inputs.suites,
        "categories": _categories(inputs.groups),
        "reference": REFERENCE,
        "greedy_only": greedy_only_skips(cfg.methods, cfg.sweeps(), greedy_only, cfg.method_params),
        "rows": rows,
    }


def accuracy_checks(inputs: Inputs) -> list[Callable[[str], bool] | None] | None:
    """Each prompt's accuracy check: a named suite's own, else the prompt file's ``answer`` under the default
    scorer (``prove.data.synthetic.score``); None when no prompt has one."""
    if inputs.checks is not None:
        return inputs.checks if any(c is not None for c in inputs.checks) else None
    if all(a is None for a in inputs.answers):
        return None
    from prove.data.synthetic import score

    def check(answer: str) -> Callable[[str], bool]:
        return lambda text: bool(score(text, answer))

    return [None if a is None else check(a) for a in inputs.answers]


def _categories(groups: Sequence[str | None]) -> list[dict[str, Any]]:
    """bench.json's ``categories``: each category's name and prompt count, in the order they first appear."""
    counts: dict[str, int] = {}
    for g in groups:
        if g is not None:
            counts[g] = counts.get(g, 0) + 1
    return [{"name": g, "n": n} for g, n in counts.items()]
