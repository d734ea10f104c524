"""prove-bench's vLLM rows (``backend=vllm``): vLLM's ``ar``, ``prove-lossless`` (the MARS checkpoint as its own
parallel drafter) and ``sd`` / ``pard`` (with ``draft``), each decoding every prompt at each concurrency of
``vllm_concurrency``, beside our rows in the same run and report.

A row is one method at one concurrency c: every prompt handed to one engine (``prove.decode.vllm.backend``) with c
requests kept in flight, timed from the first request to the last token; its tokens/s is the batch's throughput,
checked token for token against our ``ar``'s outputs of the same prompts. Every engine starts once (its start-up
is reported apart) and stays up; the rows then run round-robin — for each concurrency, each repeat, every engine in
turn — so a slow period of a shared machine hits them alike, as the bench's own rows are timed; the fastest repeat
counts. The engines hold their weights and KV caches together: each is sized when it starts, from the memory the
ones before it left free (``vllm.kv_cache_gb`` each when set; on a GPU leave them room beside our models with
``vllm.engine_args.gpu_memory_utilization=...``).

Where speculation stops paying, :func:`prove.decode.bench.metrics.crossover` reads it off the sweep: each speculative
method's tokens/s against vLLM ``ar``'s at the same concurrency.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prove.decode.bench.metrics import PromptRun, crossover, vllm_summary
from prove.decode.bench.rows import as_values

if TYPE_CHECKING:
    from prove.decode.bench.config import BenchConfig

DRAFTED = ("sd", "pard", "nsd", "asd")
"""vLLM methods that need ``draft``."""
VERIFIED = ("prove",)
"""vLLM methods that need ``verifier`` (ProVe's small verifier: vLLM's target, the MARS model its drafter)."""
SIZE_KEY = {
    "prove-lossless": "block_size",
    "pard": "block_size",
    "prove": "block_size",
    "sd": "k",
    "nsd": "k",
    "asd": "k",
}
"""The config key that sizes a vLLM method's drafts: K for the block drafters, k for a draft model."""
RULE_KEYS = {"prove": ("theta",), "nsd": ("theta",), "asd": ("budget", "gate", "max_mismatches")}
"""The rule parameters of the plugin's methods (``prove.decode.vllm.plugin``): one value a row (the first of a
sweep), ``method_params`` over the shared keys."""


def vllm_params(cfg: BenchConfig, method: str) -> dict[str, Any]:
    """K (prove-lossless, pard) or k (sd) of a vLLM row: the first value of ``block_size`` / ``k``, else the
    method's default (the trained block size for K)."""
    out: dict[str, Any] = {}
    own = (cfg.method_params or {}).get(method, {})
    for key in (SIZE_KEY.get(method), *RULE_KEYS.get(method, ())):
        if key is None:
            continue
        value = as_values(own[key] if key in own else getattr(cfg, key, None))[0]
        if value is not None:
            out[key] = value
    return out


def start_engines(cfg: BenchConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(name → started ``VllmDecoder``, name → its record: method, params, start-up seconds, engine arguments) for
    every method of ``vllm_methods`` that can run here (``sd`` / ``pard`` need ``draft``)."""
    from prove.decode.vllm.backend import VllmDecoder

    engines: dict[str, Any] = {}
    records: dict[str, Any] = {}
    try:
        for method in cfg.vllm_methods:
            if method in DRAFTED and cfg.draft is None:
                records[f"vllm {method}"] = {"method": method, "skipped": "needs draft="}
                continue
            if method in VERIFIED and cfg.verifier is None:
                records[f"vllm {method}"] = {"method": method, "skipped": "needs verifier="}
                continue
            params = vllm_params(cfg, method)
            t0 = time.perf_counter()
            dec = VllmDecoder(
                str(cfg.model),
                method=method,
                draft=cfg.draft if method in DRAFTED else None,
                verifier=cfg.verifier if method in VERIFIED else None,
                device=cfg.device,
                dtype=cfg.dtype,
                options=cfg.vllm,
                **params,
            )
            name = f"vllm {method}"
            engines[name] = dec
            keys = [k for k in (SIZE_KEY.get(method), *RULE_KEYS.get(method, ())) if k]
            resolved = {k: getattr(dec.params, k) for k in keys}  # what the engine runs, defaults included
            spec = dec.engine_args.get("speculative_config") or {}
            schedule = spec.get("num_speculative_tokens_per_batch_size")
            records[name] = {
                "method": method,
                "params": {**resolved, **({"k_schedule": schedule} if schedule else {})},
                "startup_s": time.perf_counter() - t0,
                "engine_args": dec.engine_args,
            }
    except BaseException:
        close_engines(engines)
        raise
    return engines, records


def close_engines(engines: dict[str, Any]) -> None:
    for dec in engines.values():
        dec.close()


def run_vllm_rows(
    cfg: BenchConfig,
    prompts: Sequence[list[int]],
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None,
) -> dict[str, Any]:
    """bench.json's ``vllm`` section: the engines (start-up, arguments), one row per method and concurrency, and
    each speculative method's crossover against vLLM ``ar`` (``None`` where it pays at every concurrency)."""
    stop = list(cfg.stop) or None
    engines, records = start_engines(cfg)
    best: dict[tuple[str, int], tuple[float, dict[int, Any]]] = {}
    try:
        for dec in engines.values():  # warm-up, untimed: the first requests of an engine pay for set-up
            dict(dec.generate_many(prompts[: max(cfg.warmup, 1)], cfg.max_new_tokens, stop))
        for c in cfg.vllm_concurrency:
            for _ in range(cfg.repeats):
                for name, dec in engines.items():
                    t0 = time.perf_counter()
                    outs = dict(dec.generate_many(prompts, cfg.max_new_tokens, stop, concurrency=c))
                    wall = time.perf_counter() - t0
                    if (name, c) not in best or wall < best[name, c][0]:
                        best[name, c] = (wall, outs)
    finally:
        close_engines(engines)
    rows = []
    for (name, c), (wall, outs) in best.items():
        results = [outs[i] for i in range(len(prompts))]
        summary = vllm_summary(
            [r.token_ids for r in results],
            [r.stats.to_dict() for r in results],
            [r.text for r in results],
            wall,
            reference,
            answers,
        )
        record = records[name]
        rows.append(
            {
                "name": name,
                "method": record["method"],
                "params": record["params"],
                "concurrency": c,
                "in_flight": min(c, len(prompts)),
                **summary,
            }
        )
    rows.sort(key=lambda r: (list(engines).index(r["name"]), r["concurrency"]))
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


def _lossless(row: dict[str, Any]) -> bool:
    from prove.decode.methods import resolve_params

    method, params = resolve_params(
        row["method"], **{k: v for k, v in row["params"].items() if k != "k_schedule"}
    )
    return method.is_lossless(vars(params))


def crossovers(rows: Sequence[dict[str, Any]], concurrency: Sequence[int]) -> dict[str, Any]:
    """Per speculative method, where its tokens/s falls to vLLM ``ar``'s (:func:`metrics.crossover`)."""
    by = {(r["name"], r["concurrency"]): r["tokens_per_s"] for r in rows}
    if not any(r["method"] == "ar" for r in rows):
        return {}
    out = {}
    for name in dict.fromkeys(r["name"] for r in rows if r["method"] != "ar"):
        cs = [c for c in concurrency if (name, c) in by and ("vllm ar", c) in by]
        out[name] = crossover(cs, [by[name, c] for c in cs], [by["vllm ar", c] for c in cs])
    return out
