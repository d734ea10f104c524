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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.decoder import Decoder
from prove.decode.bench.build import Inputs, build_report
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.hf_compare import check_identical, hf_compare_setup
from prove.decode.bench.metrics import PromptRun, group_key, rate_by_depth, roc_table, trace_points
from prove.decode.bench.quality import TokenScores, score_output
from prove.decode.bench.report import write_report
from prove.decode.bench.rows import REFERENCE, SAMPLING, HFRow, RowSpec, as_values, expand_rows

__all__ = ["Inputs", "build_report", "check_rows", "pass_cost", "run_bench"]


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
    for i, ids in enumerate(
        inputs.prompts[: cfg.warmup]
    ):  # warm-up: every row decodes the first prompts, untimed
        for name in names:
            decode_one(name, ids, None, cfg.seed + i)
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
    uses = {name: (*m.uses, *ENGINE_KEYS, *SAMPLING) for name, m in METHODS.items()}
    greedy_only = {name for name, m in METHODS.items() if m.greedy_only}
    specs = expand_rows(cfg.methods, cfg.sweeps(), uses, cfg.method_params, greedy_only)
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
) -> Callable[[str, list[int], Any, int], PromptRun]:
    """``decode_one(row name, prompt ids, key, seed)``: one timed decode of one prompt by one row; a sampled row
    draws from ``seed`` (the prompt's: ``cfg.seed`` + its index, the same in every repeat and rerun)."""
    from prove.decode.engine import device_sync

    eos, stop = decoders[REFERENCE].eos_ids(), list(cfg.stop)

    def decode_one(name: str, ids: list[int], rid: Any, seed: int) -> PromptRun:
        device_sync(cfg.device)
        if name in hf_rows:
            t0 = _now()
            run = hf_rows[name].generate(ids, cfg.max_new_tokens, eos, stop)
            device_sync(cfg.device)
            return dataclasses.replace(run, id=rid, wall_s=_now() - t0)
        t0 = _now()
        out = decoders[name].generate(ids, max_new_tokens=cfg.max_new_tokens, stop=stop or None, seed=seed)
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
    decode_one: Callable[[str, list[int], Any, int], PromptRun],
) -> dict[str, list[PromptRun]]:
    """Prompt by prompt, every row in turn (AR first), ``repeats`` rounds round-robin so one stall of the
    machine does not hit every try of a row; each row keeps its fastest decode of each prompt. Prompt i is
    decoded with seed ``cfg.seed + i`` by every row in every round (a sampled row's tries are the same tokens)."""
    import sys

    from tqdm import tqdm

    runs: dict[str, list[PromptRun]] = {name: [] for name in names}
    pairs = list(enumerate(zip(inputs.keys, inputs.prompts, strict=True)))
    for i, (key, ids) in tqdm(pairs, desc="bench", unit="prompt", file=sys.stderr, disable=not cfg.progress):
        tries: dict[str, list[PromptRun]] = {name: [] for name in names}
        for _ in range(cfg.repeats):
            for name in names:
                tries[name].append(decode_one(name, ids, key, cfg.seed + i))
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
