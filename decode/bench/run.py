"""``prove-bench``: several methods over one prompt set, in one process, AR first as the reference (docs/design.md §3.1).

    prove-bench model=runs/tiny/mars verifier=runs/tiny/verifier draft=runs/tiny/verifier \\
        prompts=data/tiny/test.jsonl methods=[ar,mars,prove,prove-lossless,sd] theta=[0.05,0.1,0.3]

Per row (a method at one point of the parameter sweep) it reports tokens per cycle (which counts the
correction / bonus token), model / verifier / draft forward passes per token, the wall-clock speedup over
AR measured in the same run, agreement with AR's output (the first position where they diverge, per
prompt; lossless methods must agree on every prompt) and task accuracy where the prompts carry an
``answer``. Rows from transformers itself (``generate`` greedy; assisted generation with the same draft,
k = 5, constant schedule) run beside them, so our AR and SD are compared with the library users have.

Timing. Every row decodes a warm-up prompt first (untimed). Then the loop runs prompt by prompt and, for
each prompt, every row in turn (AR first): a slow period of the machine hits all rows alike, so speedups
are ratios measured side by side; ``repeats`` > 1 keeps each row's fastest decode of each prompt. On CUDA,
timings are bracketed by ``torch.cuda.synchronize``.

The pure numbers are :mod:`prove.decode.bench.metrics`; this module is the plumbing, ``run_bench`` its
steps in order. This module imports neither torch nor transformers at import time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.decoder import Decoder
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.hf_compare import check_identical, hf_compare_report, hf_compare_setup
from prove.decode.bench.metrics import (
    PromptRun,
    group_key,
    rate_by_depth,
    roc_table,
    summarize,
    summarize_groups,
    tokens_per_cycle_by_position,
    trace_points,
)
from prove.decode.bench.quality import TokenScores, quality_summary, score_output
from prove.decode.bench.report import SCHEMA, environment, write_report
from prove.decode.bench.rows import (
    ONLY_WITH,
    REFERENCE,
    HFRow,
    RowSpec,
    as_values,
    expand_rows,
    is_lossless,
)


def load_models(cfg: BenchConfig) -> dict[str, Any]:
    """The tokenizer and every model, loaded once and shared by all rows."""
    from prove.common.checkpoint import vocab_difference
    from prove.decode.decoder import check_source, load_model, load_tokenizer

    for role in ("model", "verifier", "draft"):
        if getattr(cfg, role) is not None:
            check_source(getattr(cfg, role), role)
    tokenizer = load_tokenizer(cfg.model)

    def load(path: str) -> Any:
        return load_model(path, cfg.device, cfg.dtype)

    models: dict[str, Any] = {"tokenizer": tokenizer, "model": load(cfg.model)}
    loaded: dict[str, Any] = {cfg.model: models["model"]}
    if cfg.quality and cfg.quality_model is not None and cfg.quality_model != cfg.model:
        from prove.data.gguf import hf_folder, is_gguf

        path = str(hf_folder(cfg.quality_model)) if is_gguf(cfg.quality_model) else cfg.quality_model
        check_source(path, "quality_model")
        if vocab_difference(tokenizer, load_tokenizer(path)):
            raise ValueError(
                f"quality_model={cfg.quality_model} has a different tokenizer from model={cfg.model}: it scores the "
                "same token ids, so give a model of the same family (the proposer's base), or quality_model=null"
            )
        models["quality"] = load(path)
    for role in ("verifier", "draft"):
        path = getattr(cfg, role)
        if path is None:
            continue
        if path not in loaded:  # a path shared by roles: its tokenizer is checked and its model loaded once
            if vocab_difference(tokenizer, load_tokenizer(path)):
                raise ValueError(
                    f"{role}={path} has a different tokenizer from model={cfg.model}: the {role} must share "
                    "the model's vocabulary (apart from <|mask|>)"
                )
            loaded[path] = load(path)
        models[role] = loaded[path]
    return models


def build_decoders(
    cfg: BenchConfig, rows: Sequence[RowSpec], models: Mapping[str, Any]
) -> dict[str, Decoder]:
    """A Decoder per row over the shared models; every construction error surfaces before any timing."""
    from prove.decode.decoder import Decoder
    from prove.decode.methods import get_method

    decoders: dict[str, Decoder] = {}
    for row in rows:
        method = get_method(row.method)
        decoders[row.name] = Decoder(
            models["model"],
            models["tokenizer"],
            method=method,
            verifier=models.get("verifier") if method.needs_verifier else None,
            draft=models.get("draft") if method.needs_draft else None,
            device=cfg.device,
            **row.params,
        )
    return decoders


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


def _resolved_params(decoder: Decoder) -> dict[str, Any]:
    params = {k: getattr(decoder.params, k) for k in decoder.method.uses}
    for k, parent in ONLY_WITH.items():  # e.g. unfused: neither fuse nor fuse_groups says anything
        if not params.get(parent):
            params.pop(k, None)
            params.pop(parent, None)
    return params


@dataclass
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


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the bench; write bench.json, bench.md and the plots into ``cfg.output_dir``; return the report.

    The steps, in order: check every row's parameters (before any model loads) → load the prompts and
    models → build a Decoder per row (and transformers' rows) → check every prompt fits every model →
    warm up → the timed rounds → the untimed trace pass → the pass cost curve → vLLM's rows
    (``backend=vllm``) → the report.
    """
    specs = check_rows(cfg)
    inputs = load_inputs(cfg)
    decoders = build_decoders(cfg, specs, inputs.models)
    inputs.prompts = [decoders[REFERENCE].encode(p) for p in inputs.prompts]  # ids pass through unchanged
    hf_rows = reference_rows(cfg, inputs.models)
    check_lengths(decoders, inputs, cfg.max_new_tokens)
    names = [REFERENCE, *hf_rows, *(s.name for s in specs[1:])]
    decode_one = row_decoder(cfg, decoders, hf_rows)
    for ids in inputs.prompts[: cfg.warmup]:  # warm-up: every row decodes the first prompts, untimed
        for name in names:
            decode_one(name, ids, None)
    runs = timed_rounds(cfg, names, inputs, decode_one)
    quality = score_rows(inputs, runs, decoders[REFERENCE].models.allowed) if cfg.quality else None
    eos, stop = decoders[REFERENCE].eos_ids(), list(cfg.stop)
    trace = (
        trace_pass(cfg, inputs.models, inputs.prompts, eos, stop)
        if cfg.trace and cfg.hf_compare is None
        else None
    )
    cost = None
    if cfg.pass_cost_widths:
        cost = pass_cost(
            inputs.models["model"],
            inputs.prompts[0],
            cfg.pass_cost_widths,
            cfg.pass_cost_context,
            cfg.pass_cost_repeats,
        )
    vllm = None
    if cfg.backend == "vllm":  # vLLM's rows over the concurrency sweep, checked against our ar
        from prove.decode.bench.vllm_rows import run_vllm_rows

        has_answers = inputs.checks is None and any(
            a is not None for a in inputs.answers
        )  # suites: ours only
        vllm = run_vllm_rows(cfg, inputs.prompts, runs[REFERENCE], inputs.answers if has_answers else None)
    report = build_report(cfg, specs, decoders, runs, inputs, trace, cost, hf_rows, vllm, quality)
    write_report(report, cfg.output_dir, plots=cfg.plots)
    check_identical(report, cfg.output_dir)
    return report


def check_rows(cfg: BenchConfig) -> list[RowSpec]:
    """The rows, every one's parameters checked (``resolve_params``) before any model loads."""
    from prove.decode.config import ENGINE_KEYS
    from prove.decode.methods import METHODS, resolve_params

    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; registered: {', '.join(sorted(METHODS))}")
    uses = {name: (*m.uses, *ENGINE_KEYS) for name, m in METHODS.items()}
    specs = expand_rows(cfg.methods, cfg.sweeps(), uses, cfg.method_params)
    for spec in specs:
        resolve_params(spec.method, **spec.params)
    return specs


def load_inputs(cfg: BenchConfig) -> Inputs:
    """The prompt file (its first ``n_prompts``) and the models, or ``hf_compare``'s random ones."""
    from prove.data.prompts import read_prompts, render

    if cfg.hf_compare is not None:
        models, prompt_ids = hf_compare_setup(cfg)
        n = len(prompt_ids)
        return Inputs(keys=list(range(n)), prompts=prompt_ids, answers=[None] * n, models=models)
    if cfg.suite:
        return load_suite_inputs(cfg)
    assert cfg.prompts is not None, "BenchConfig checks prompts="
    records = read_prompts(cfg.prompts)[: cfg.n_prompts]
    return Inputs(
        keys=[r.id for r in records],
        prompts=[render(r, cfg.chat) for r in records],  # encoded once the reference Decoder exists
        answers=[r.answer for r in records],
        models=load_models(cfg),
        groups=[r.category for r in records],
    )


def load_suite_inputs(cfg: BenchConfig) -> Inputs:
    """The named suites' prompts (``prove.decode.suites``; MT-bench's second turns after the model's cached AR
    first answers), the first ``n_prompts`` of them, each with its category and check."""
    from prove.data.prompts import render
    from prove.decode.suites import check_suites, configured_sources, load_configured, suite_names

    check_suites(
        suite_names(cfg.suite), configured_sources(cfg)
    )  # a missing package fails before a model loads
    models = load_models(cfg)
    loaded = load_configured(
        cfg,
        model=models["model"],
        tokenizer=models["tokenizer"],
        run_code=cfg.run_code,
        progress=cfg.progress,
    )
    n = cfg.n_prompts
    records, suites, checks = loaded.records[:n], loaded.suites[:n], loaded.checks[:n]
    return Inputs(
        keys=[r.id for r in records],
        prompts=[render(r, cfg.chat) for r in records],
        answers=[r.answer for r in records],
        models=models,
        groups=[group_key(s, r.category) for s, r in zip(suites, records, strict=True)],
        checks=checks,
        suites=loaded.info,
    )


def reference_rows(cfg: BenchConfig, models: Mapping[str, Any]) -> dict[str, HFRow]:
    """transformers' ``generate`` rows beside ours (``hf=true``): greedy, and assisted with the draft."""
    rows: dict[str, HFRow] = {}
    if cfg.hf:
        rows["hf-greedy"] = HFRow(models["model"], models["tokenizer"])
        if "draft" in models:
            rows["hf-assisted"] = HFRow(
                models["model"], models["tokenizer"], models["draft"], cfg.hf_assistant_tokens
            )
            if cfg.hf_assistant_threshold:
                rows["hf-assisted-confidence"] = HFRow(
                    models["model"],
                    models["tokenizer"],
                    models["draft"],
                    cfg.hf_assistant_tokens,
                    cfg.hf_assistant_threshold,
                )
    return rows


def check_lengths(decoders: Mapping[str, Decoder], inputs: Inputs, max_new_tokens: int) -> None:
    """A prompt too long for any row's models fails here, before any timing."""
    for key, ids in zip(inputs.keys, inputs.prompts, strict=True):
        for dec in decoders.values():
            try:
                dec.check_length(len(ids), max_new_tokens)
            except ValueError as e:
                raise ValueError(f"prompt {key!r}: {e}") from None


def row_decoder(
    cfg: BenchConfig, decoders: Mapping[str, Decoder], hf_rows: Mapping[str, HFRow]
) -> Callable[[str, list[int], Any], PromptRun]:
    """``decode_one(row name, prompt ids, key)``: one timed decode of one prompt by one row."""
    from prove.decode.engine import device_sync

    eos, stop = decoders[REFERENCE].eos_ids(), list(cfg.stop)

    def decode_one(name: str, ids: list[int], rid: Any) -> PromptRun:
        device_sync(cfg.device)
        if name in hf_rows:
            t0 = _now()
            run = hf_rows[name].generate(ids, cfg.max_new_tokens, eos, stop)
            device_sync(cfg.device)
            return dataclasses.replace(run, id=rid, wall_s=_now() - t0)
        t0 = _now()
        out = decoders[name].generate(ids, max_new_tokens=cfg.max_new_tokens, stop=stop or None)
        device_sync(cfg.device)
        wall = _now() - t0
        s = out.stats
        return PromptRun(
            id=rid,
            token_ids=list(out.token_ids),
            text=out.text,
            wall_s=wall,
            model_s=s.model_s,
            cycles=s.cycles,
            model_passes=s.model_passes,
            verifier_passes=s.verifier_passes,
            draft_passes=s.draft_passes,
            accepted_by_depth=list(s.accepted_by_depth),
            proposed_by_depth=list(s.proposed_by_depth),
            committed_per_cycle=list(s.committed_per_cycle),
        )

    return decode_one


def timed_rounds(
    cfg: BenchConfig,
    names: Sequence[str],
    inputs: Inputs,
    decode_one: Callable[[str, list[int], Any], PromptRun],
) -> dict[str, list[PromptRun]]:
    """Prompt by prompt, every row in turn (AR first), ``repeats`` rounds round-robin so one stall of the
    machine does not hit every try of a row; each row keeps its fastest decode of each prompt."""
    import sys

    from tqdm import tqdm

    runs: dict[str, list[PromptRun]] = {name: [] for name in names}
    pairs = list(zip(inputs.keys, inputs.prompts, strict=True))
    for key, ids in tqdm(pairs, desc="bench", unit="prompt", file=sys.stderr, disable=not cfg.progress):
        tries: dict[str, list[PromptRun]] = {name: [] for name in names}
        for _ in range(cfg.repeats):
            for name in names:
                tries[name].append(decode_one(name, ids, key))
        for name in names:
            runs[name].append(min(tries[name], key=lambda r: r.wall_s))
    return runs


def score_rows(
    inputs: Inputs, runs: Mapping[str, list[PromptRun]], allowed: Any
) -> dict[str, list[TokenScores]]:
    """Every row's outputs scored teacher-forced (:mod:`prove.decode.bench.quality`), untimed: the target's greedy
    agreement over ``allowed`` and the log-likelihood under ``inputs.models["quality"]`` (the target where none).
    An output several rows share (every lossless row's) is scored once."""
    import sys

    from tqdm import tqdm

    target = inputs.models["model"]
    scorer = inputs.models.get("quality", target)
    cache: dict[tuple[int, tuple[int, ...]], TokenScores] = {}
    out: dict[str, list[TokenScores]] = {}
    for name, row_runs in tqdm(runs.items(), desc="quality", unit="row", file=sys.stderr):
        out[name] = []
        for i, (ids, run) in enumerate(zip(inputs.prompts, row_runs, strict=True)):
            key = (i, tuple(run.token_ids))
            if key not in cache:
                cache[key] = score_output(target, scorer, ids, run.token_ids, allowed)
            out[name].append(cache[key])
    return out


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
    :func:`quality_summary` against AR), the environment, the inputs, and vLLM's rows (``vllm``, ``backend=vllm``)."""
    checks = accuracy_checks(inputs)
    grouped = any(g is not None for g in inputs.groups)
    spec_by_name = {s.name: s for s in specs}
    rows = []
    for name, row_runs in runs.items():
        summary = summarize(row_runs, runs[REFERENCE], checks=checks, bin_size=cfg.bin_size)
        starts, means, counts = tokens_per_cycle_by_position(
            (r.committed_per_cycle for r in row_runs), cfg.position_bin
        )
        summary["by_position"] = {
            "bin_size": cfg.position_bin,
            "start": starts,
            "mean": means,
            "cycles": counts,
        }
        if grouped:
            summary["by_category"] = summarize_groups(
                row_runs, runs[REFERENCE], inputs.groups, checks=checks, bin_size=cfg.position_bin
            )
        spec = spec_by_name.get(name)
        if spec:
            params = _resolved_params(decoders[name])
            lossless = is_lossless(spec.method, params)
        else:  # a transformers row
            params = (hf_rows or {})[name].params
            lossless = True
        fuse_cost = _cost_record(decoders[name]) if spec else None
        rows.append(
            {
                "name": name,
                "method": spec.method if spec else name,
                "params": params,
                "swept": dict(spec.params) if spec else {},
                "lossless": lossless,
                "path": ("fast" if getattr(decoders[name], "fast_engine", None) else "reference")
                if spec
                else name,
                **summary,
                **({"fuse_cost": fuse_cost} if fuse_cost else {}),
                **(
                    {"pad_plans": {k: v.record() for k, v in decoders[name].pad_plans.items()}}
                    if spec and getattr(decoders[name], "pad_plans", None)
                    else {}
                ),
                **(
                    {
                        "quality": quality_summary(
                            quality[name], quality[REFERENCE], [r.token_ids for r in row_runs]
                        )
                    }
                    if quality
                    else {}
                ),
                "per_prompt": [
                    {
                        "id": r.id,
                        "new_tokens": r.new_tokens,
                        "cycles": r.cycles,
                        "wall_s": r.wall_s,
                        "first_divergence": d,
                        "text": r.text,
                    }
                    for r, d in zip(row_runs, summary["first_divergence"], strict=True)
                ],
            }
        )
    report: dict[str, Any] = {
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
        "rows": rows,
        "lossless_violations": [r["name"] for r in rows if r["lossless"] and r["agreement"] < 1]
        + (vllm["violations"] if vllm else []),
        "trace": trace,
        "vllm": vllm,
        "pass_cost": cost,
        "plots": {},
    }
    if cfg.hf_compare is not None:
        report.update(hf_compare_report(cfg, runs, len(inputs.prompts), specs))
    return report


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


def _now() -> float:
    import time

    return time.perf_counter()


def trace_pass(
    cfg: BenchConfig, models: Mapping[str, Any], prompts: Sequence[list[int]], eos: list[int], stop: list[str]
) -> dict[str, Any] | None:
    """prove-lossless with ``trace=True`` (and the verifier as a probe when given), untimed: per-position
    p̃, q and "matches greedy"; ``None`` when the model is not a block proposer."""
    import warnings

    from prove.decode.decoder import Decoder

    block = as_values(cfg.block_size)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dec = Decoder(
                models["model"],
                models["tokenizer"],
                method="prove-lossless",
                verifier=models.get("verifier"),
                device=cfg.device,
                trace=True,
                **({"block_size": block} if block is not None else {}),
            )
    except ValueError as e:  # not a block model: no trace
        return {"skipped": str(e)}
    traces = [
        dec.generate(ids, max_new_tokens=cfg.max_new_tokens, stop=stop or None).stats.trace for ids in prompts
    ]
    points = trace_points(traces)
    match = rate_by_depth(
        ([int(m) for m in row["matched"]] for t in traces for row in (t or ())),
        ([1] * len(row["matched"]) for t in traces for row in (t or ())),
    )
    return {
        "method": "prove-lossless",
        "block_size": dec.params.block_size,
        "verifier": cfg.verifier,
        "positions": len(points["matched"]),
        "match_by_depth": match,
        "roc": roc_table(points),
    }


def pass_cost(model: Any, prompt: Sequence[int], widths: int, context: int, repeats: int) -> dict[str, Any]:
    """Wall time of one pass feeding w tokens (w = 1..``widths``) after ``context`` cached tokens
    (``prove.decode.engine.fused.measure_pass_cost``: the fused pass's masked path, w = 1 being an AR step); also the
    plain ``forward`` for w = 1 (AR's unmasked step), timed in the same rounds, to show the mask's own overhead."""
    from prove.decode.engine.fused import measure_pass_cost

    seq = (list(prompt) * (context // max(len(prompt), 1) + 1))[:context]
    *best, plain = measure_pass_cost(
        model, range(1, widths + 1), context=seq, repeats=repeats, plain_step=True
    )
    return {
        "context": context,
        "repeats": repeats,
        "widths": list(range(1, widths + 1)),
        "ms": [1000 * t for t in best],
        "ratio": [t / best[0] for t in best],
        "plain_t1_ms": 1000 * plain,
    }
