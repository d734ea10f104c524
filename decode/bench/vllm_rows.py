"""prove-bench's vLLM rows (``backend=vllm``): vLLM's ``ar``, ``prove-lossless`` (the MARS checkpoint as its own
parallel drafter), ``sd`` / ``pard`` (with ``draft``) and our rules in vLLM's step (``prove`` with ``verifier``,
``nsd`` / ``asd`` with ``draft``: ``prove.decode.vllm.plugin``), each decoding every prompt at each concurrency of
``vllm_concurrency``, beside our rows in the same run and report.

A row is one method at one point of its rule's sweep (θ for ``prove`` and ``nsd``; ASD's budget, gate and
max_mismatches) at one concurrency c: every prompt handed to the method's engine (``prove.decode.vllm.backend``) with
c requests kept in flight and the rule's values sent with each request (``SamplingParams.extra_args``), timed from
the first request to the last token; its tokens/s is the batch's throughput, checked token for token against our
``ar``'s outputs of the same prompts. One engine a method serves every point of its sweep (K or k is fixed when an
engine starts: the first of its sweep); :func:`vllm_engines` plans them, rows named as our rows are (the swept
values: ``vllm prove θ=0.1``), from ``vllm_method_params`` where it names the method, else ``method_params``, over
the shared keys. Every engine starts once (its start-up is reported apart) and stays up; the rows then run
round-robin — for each concurrency, each repeat, every row in turn — so a slow period of a shared machine hits them
alike, as the bench's own rows are timed; the fastest repeat counts. The engines hold their weights and KV caches
together: each is sized when it starts, from the memory the ones before it left free (``vllm.kv_cache_gb`` each when
set; on a GPU leave them room beside our models with ``vllm.engine_args.gpu_memory_utilization=...``).

Where speculation stops paying, :func:`prove.decode.bench.metrics.crossover` reads it off the sweep: each speculative
row's tokens/s against vLLM ``ar``'s at the same concurrency.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prove.decode.bench.metrics import PromptRun, crossover, vllm_summary
from prove.decode.bench.rows import RowSpec, as_values, param_label
from prove.decode.methods import get_method
from prove.decode.vllm.backend import size_key
from prove.decode.vllm.plugin import rule_keys

if TYPE_CHECKING:
    from prove.decode.bench.config import BenchConfig


@dataclass(frozen=True)
class VllmEngine:
    """One vLLM engine of the bench and the rows it serves."""

    method: str
    params: dict[str, Any]
    """What the engine starts with: K or k (the first value of its sweep; absent = the method's default)."""
    rows: tuple[RowSpec, ...]
    """One per point of the rule's sweep (``plugin.rule_keys``; one row for the methods without a rule): its name and
    the rule's values, sent with each of its requests (absent = the method's default)."""

    @property
    def name(self) -> str:
        return f"vllm {self.method}"


def vllm_engines(
    methods: Sequence[str],
    sweeps: Mapping[str, Any],
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    vllm_method_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[VllmEngine]:
    """The bench's vLLM engines, one per method of ``methods`` (``vllm_methods``), each with its rows.

    A method's values: ``vllm_method_params[method]`` where it names the method, else ``method_params[method]``
    (our rows' own, of which the keys vLLM does not read are left to them), over the shared ``sweeps``. K / k: the
    first value (an engine is started with one); each point of the rule's keys: a row, named ``vllm <method>`` plus
    the swept values as our rows name them (``vllm prove θ=0.1``; no values when nothing is swept). Every point is
    checked by the method's own checks (``resolve_params``). A ``ValueError`` names the fix for a method of
    ``vllm_method_params`` not in ``methods``, a key the vLLM row does not read, several K or k there, or a repeated
    row."""
    from prove.decode.methods import resolve_params

    method_params, own = method_params or {}, vllm_method_params or {}
    for m, given in own.items():
        if m not in methods:
            raise ValueError(
                f"vllm_method_params names method {m!r}, which is not in vllm_methods={list(methods)}: add it there, "
                "or drop it"
            )
        reads = [k for k in (size_key(m), *rule_keys(m)) if k]
        unread = sorted(set(given) - set(reads))
        if unread:
            raise ValueError(
                f"vllm_method_params: vLLM {m} reads {reads or 'no parameter'} per row, not {unread}: drop them "
                "(our rows' own go in method_params)"
            )
        size = size_key(m)
        if size is not None and size in given and len(as_values(given[size])) > 1:
            raise ValueError(
                f"vllm_method_params: vLLM {m}'s {size}={given[size]} is fixed when its engine starts (one engine a "
                f"method): give one value, e.g. {size}={as_values(given[size])[0]} (our rows sweep it in method_params)"
            )
    engines = []
    for m in dict.fromkeys(methods):
        merged = {**sweeps, **(own[m] if m in own else method_params.get(m, {}))}
        size = size_key(m)
        engine = {} if size is None else {size: as_values(merged.get(size))[0]}
        engine = {k: v for k, v in engine.items() if v is not None}
        keys = [k for k in rule_keys(m) if k in merged]
        grids = [as_values(merged[k]) for k in keys]
        swept = [k for k, g in zip(keys, grids, strict=True) if len(g) > 1]
        rows = []
        for point in itertools.product(*grids):
            params = {k: v for k, v in zip(keys, point, strict=True) if v is not None}
            resolve_params(m, **engine, **params)
            label = " ".join(param_label(k, params[k]) for k in swept if k in params)
            rows.append(RowSpec(f"vllm {m} {label}".strip(), m, params))
        names = [r.name for r in rows]
        if len(set(names)) != len(names):
            raise ValueError(f"the vLLM sweep of {m} repeats a row ({names}): give each value once")
        engines.append(VllmEngine(m, engine, tuple(rows)))
    return engines


def plan(cfg: BenchConfig) -> list[VllmEngine]:
    """:func:`vllm_engines` of a bench config."""
    return vllm_engines(cfg.vllm_methods, cfg.sweeps(), cfg.method_params, cfg.vllm_method_params)


def start_engines(cfg: BenchConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine name → started ``VllmDecoder``, engine name → its record: method, params, start-up seconds, engine
    arguments, the rows it serves) for every engine of :func:`plan` that can run here (``sd`` / ``pard`` / ``nsd`` /
    ``asd`` need ``draft``, ``prove`` a ``verifier``)."""
    from prove.decode.vllm.backend import VllmDecoder

    engines: dict[str, Any] = {}
    records: dict[str, Any] = {}
    try:
        for spec in plan(cfg):
            method, name = spec.method, spec.name
            needs = get_method(method)
            if needs.needs_draft and cfg.draft is None:
                records[name] = {"method": method, "skipped": "needs draft="}
                continue
            if needs.needs_verifier and cfg.verifier is None:
                records[name] = {"method": method, "skipped": "needs verifier="}
                continue
            t0 = time.perf_counter()
            dec = VllmDecoder(
                str(cfg.model),
                method=method,
                draft=cfg.draft if needs.needs_draft else None,
                verifier=cfg.verifier if needs.needs_verifier else None,
                device=cfg.device,
                dtype=cfg.dtype,
                options=cfg.vllm,
                **spec.params,
            )
            engines[name] = dec
            size = size_key(method)
            resolved = {} if size is None else {size: getattr(dec.params, size)}  # defaults included
            engine_spec = dec.engine_args.get("speculative_config") or {}
            schedule = engine_spec.get("num_speculative_tokens_per_batch_size")
            records[name] = {
                "method": method,
                "params": {**resolved, **({"k_schedule": schedule} if schedule else {})},
                "rows": [row.name for row in spec.rows],
                "startup_s": time.perf_counter() - t0,
                "engine_args": dec.engine_args,
            }
    except BaseException:
        close_engines(engines)
        raise
    return engines, records


def row_sampling(dec: Any, row: RowSpec) -> Any:
    """The ``sampling`` (``DecodeParams``) a row's requests carry: the engine's parameters with the row's rule values
    (``None`` for a row without any: the engine's own)."""
    return dataclasses.replace(dec.params, **row.params) if row.params else None


def close_engines(engines: dict[str, Any]) -> None:
    for dec in engines.values():
        dec.close()


def run_vllm_rows(
    cfg: BenchConfig,
    prompts: Sequence[list[int]],
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None,
) -> dict[str, Any]:
    """bench.json's ``vllm`` section: the engines (start-up, arguments, their rows), one row per method, point of its
    rule's sweep and concurrency (with each prompt's text), each speculative row's crossover against vLLM ``ar``
    (``None`` where it pays at every concurrency), and the lossless rows that differ from our ``ar``."""
    engines, records = start_engines(cfg)
    specs = {e.name: e for e in plan(cfg)}
    try:
        # every row with its engine and what its requests carry: one engine serves each point of its rule's sweep
        served = [
            (row, records[name], dec, row_sampling(dec, row))
            for name, dec in engines.items()
            for row in specs[name].rows
        ]
        best = timed_vllm_rounds(cfg, engines, served, prompts)
    finally:
        close_engines(engines)
    rows = [
        vllm_row(row, record, rule_values(row, dec, sampling), c, best[row.name, c], reference, answers)
        for row, record, dec, sampling in served
        for c in cfg.vllm_concurrency
    ]
    for row in rows:
        ar = next((r for r in rows if r["method"] == "ar" and r["concurrency"] == row["concurrency"]), None)
        row["vs_vllm_ar"] = row["tokens_per_s"] / ar["tokens_per_s"] if ar else None
    return {
        "engines": records,
        "rows": rows,
        "crossover": crossovers(rows, cfg.vllm_concurrency),
        # a lossless row that differs from our ar (prove is lossy; asd with a zero budget is not)
        "violations": [
            f"{r['name']} c={r['concurrency']}" for r in rows if r["agreement"] < 1 and _lossless(r)
        ],
    }


Served = tuple[RowSpec, dict[str, Any], Any, Any]
"""A vLLM row, its engine's record, the engine, and what its requests carry (:func:`row_sampling`)."""


def timed_vllm_rounds(
    cfg: BenchConfig, engines: Mapping[str, Any], served: Sequence[Served], prompts: Sequence[list[int]]
) -> dict[tuple[str, int], tuple[float, dict[int, Any], int]]:
    """Each engine warmed up (untimed), then for each concurrency, each repeat, every row in turn: per (row name,
    concurrency) the fastest try's (wall seconds, outputs by prompt index, preemptions during it)."""
    stop = list(cfg.stop) or None
    best: dict[tuple[str, int], tuple[float, dict[int, Any], int]] = {}
    for dec in engines.values():  # warm-up, untimed: the first requests of an engine pay for set-up
        dict(dec.generate_many(prompts[: max(cfg.warmup, 1)], cfg.max_new_tokens, stop))
    for c in cfg.vllm_concurrency:
        for _ in range(cfg.repeats):
            for row, _, dec, sampling in served:
                before = dec.preemptions()
                t0 = time.perf_counter()
                outs = dict(
                    dec.generate_many(prompts, cfg.max_new_tokens, stop, concurrency=c, sampling=sampling)
                )
                wall = time.perf_counter() - t0
                if (row.name, c) not in best or wall < best[row.name, c][0]:
                    best[row.name, c] = (wall, outs, dec.preemptions() - before)
    return best


def rule_values(row: RowSpec, dec: Any, sampling: Any) -> dict[str, Any]:
    """The values of the row's rule keys its requests ran with (the engine's where the row sets none)."""
    return {k: getattr(sampling or dec.params, k) for k in rule_keys(row.method)}


def vllm_row(
    row: RowSpec,
    record: Mapping[str, Any],
    rule: Mapping[str, Any],
    c: int,
    timed: tuple[float, dict[int, Any], int],
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None,
) -> dict[str, Any]:
    """One vLLM row of bench.json at concurrency ``c``: its numbers (:func:`vllm_summary`) and per-prompt texts."""
    wall, outs, preempted = timed
    results = [outs[i] for i in range(len(reference))]
    summary = vllm_summary(
        [r.token_ids for r in results],
        [r.stats.to_dict() for r in results],
        [r.text for r in results],
        wall,
        reference,
        answers,
    )
    return {
        "name": row.name,
        "method": row.method,
        "params": {**record["params"], **rule},
        "concurrency": c,
        "in_flight": min(c, len(reference)),
        "preemptions": preempted,  # vLLM's count during the timed run (a full KV cache)
        **summary,
        "per_prompt": [
            {"id": ref.id, "new_tokens": len(r.token_ids), "cycles": r.stats.cycles, "text": r.text}
            for r, ref in zip(results, reference, strict=True)
        ],
    }


def _lossless(row: Mapping[str, Any]) -> bool:
    from prove.decode.methods import resolve_params

    method, params = resolve_params(
        row["method"], **{k: v for k, v in row["params"].items() if k != "k_schedule"}
    )
    return method.is_lossless(vars(params))


def crossovers(rows: Sequence[Mapping[str, Any]], concurrency: Sequence[int]) -> dict[str, Any]:
    """Per speculative row (by name: each point of a rule's sweep apart), where its tokens/s falls to vLLM ``ar``'s
    at the same concurrency (:func:`metrics.crossover`); empty without an ``ar`` row."""
    ar = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["method"] == "ar"}
    if not ar:
        return {}
    by = {(r["name"], r["concurrency"]): r["tokens_per_s"] for r in rows}
    out = {}
    for name in dict.fromkeys(r["name"] for r in rows if r["method"] != "ar"):
        cs = [c for c in concurrency if (name, c) in by and c in ar]
        out[name] = crossover(cs, [by[name, c] for c in cs], [ar[c] for c in cs])
    return out
