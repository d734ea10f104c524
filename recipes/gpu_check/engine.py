"""Part 4, engine: our engine against transformers, in one process, on the same weights and prompt (issue: the
engine at GPU speed).

Per shape (random weights, ``engine_dtype``, one request of ``engine_new_tokens`` tokens): transformers' eager
``generate`` (DynamicCache), transformers' ``generate(cache_implementation="static")`` (compiled, warmed up; only
on ``engine_hf_compile_shapes``: at 32B its compile took over 140 s), our reference path (``fast=false``), our fast
``ar``, fast ``prove-lossless`` (K = ``block_size``), and fast prove-lossless with an injected acceptance of 2, 3
and 4.5 tokens per cycle, unfused and fused alike (``rules.twins.InjectedAcceptance``, passed to ``FastEngine.set_rule``: random weights accept nothing; a pass's
cost does not depend on the tokens it holds). Fused on the fast path is one tree of K² entries a cycle (every
group, no second candidate). On ``engine_compile_shapes`` fast ar and the 4.5 rows run again with
``compile=true`` (the cycle through inductor before its capture), their compile timed in the warm-up. Each row
reports tok/s, its ratio to transformers' compiled AR, host wall time per cycle against the GPU time of one cycle
(graph replays timed back to back), syncs and graph replays per cycle, graph captures.

Then the graph-mode pass cost t(w): one pass of w tokens on a warm slot cache of ``cache_len`` tokens, captured as
a CUDA graph and replayed (eager on the CPU), beside part 3's eager curve when that part ran.
"""

from __future__ import annotations

import gc
import statistics
import time
import warnings
from typing import Any

from prove.decode.random_models import random_model, random_prompts, shape_config
from prove.decode.rules.twins import InjectedAcceptance
from prove.recipes.gpu_check.config import SHAPES, CheckConfig
from prove.recipes.gpu_check.decoding import hf_greedy
from prove.recipes.gpu_check.runtime import Timer, check_entry, describe_error, free


def injected_counts(tokens_per_cycle: float) -> list[int]:
    """Accepted counts n per cycle whose committed length n + 1 averages ``tokens_per_cycle`` (halves alternate)."""
    n = tokens_per_cycle - 1
    lo = int(n)
    return [lo] if n == lo else [lo, lo + 1]


def hf_static(model: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy ``generate`` on its static cache, which compiles the decode step."""
    return hf_greedy(model, prompt, n, cache_implementation="static")


def cache_len(cfg: CheckConfig) -> int:
    """A request-sized cache: the prompt + new tokens + K² + K (the most scratch a row's last cycles write past the
    budget: the fused tree's K² + K − 3 with a cycle launched ahead, ``FastEngine.slots_needed``), rounded up to 64,
    as transformers' static cache sizes itself to the request. The rows run on the Decoder's default cache (a pass
    attends the slots in use); one AR row runs on this one, to show the two cost the same."""
    need = cfg.engine_prompt_len + cfg.engine_new_tokens + cfg.block_size**2 + cfg.block_size
    return -(-need // 64) * 64


def _dynamo_frames() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(sum(counters["stats"].values()) + sum(counters["frames"].values()))
    except Exception:  # noqa: BLE001 - torch without dynamo counters: unknown
        return -1


def _ours(model: Any, method: str, params: dict[str, Any], cfg: CheckConfig, vocab: int) -> Any:
    from prove.decode.decoder import Decoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no prove.json: "records no trained block size"
        return Decoder(
            model,
            None,
            method=method,
            mask_token_id=vocab - 1 if method == "prove-lossless" else None,
            device=cfg.device,
            **params,
        )


def _row_of(dec: Any, prompt: list[int], n: int, timer: Timer, ref: list[int]) -> dict[str, Any]:
    dec.generate(prompt, max_new_tokens=min(n, 16))  # warm-up (captures the graph on CUDA)
    ms, res = timer(dec.generate, prompt, max_new_tokens=n)
    s = res.stats
    row: dict[str, Any] = {
        "ms": ms,
        "tokens": len(res.token_ids),
        "tok_s": len(res.token_ids) / (ms / 1e3),
        "tokens_per_cycle": s.tokens_per_cycle,
        "cycles": s.cycles,
        "host_ms_per_cycle": s.wall_s * 1e3 / max(s.cycles, 1),
        "path": "fast" if s.fast is not None else "reference",
        "agree_with_transformers": res.token_ids == ref,
    }
    if s.fast is not None:
        c = max(s.cycles, 1)
        row.update(
            syncs_per_cycle=s.fast["syncs"] / c,
            graph_replays_per_cycle=s.fast["graph_replays"] / c,
            eager_cycles=s.fast["eager_cycles"],
            graph_captures=dec.fast_engine.counters["captures"],
            gpu_ms_per_cycle=dec.fast_engine.replay_ms(),
        )
        if (
            dec.fast_engine.compiled
        ):  # compiled in the warm-up decode (its capture); a timed compile is a drift
            row.update(compile_s=dec.fast_engine.compile_s, compiles=dec.fast_engine.counters["compiles"],
                       compiles_while_timed=s.fast["compiles"])  # fmt: skip
            row["path"] = f"fast, compiled ({row['compile_s']:.1f} s, {row['compiles']} graph(s))"
    return row


EngineSpec = tuple[str, str, dict[str, Any], list[int] | None]
"""A row of ours: its name, method, Decoder parameters and injected accepted counts (None: the rule decides)."""


def run_shape(shape: str, cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Every row of one shape (see the module's docstring)."""
    import torch

    config = shape_config(SHAPES[shape])
    vocab = config.vocab_size
    model = random_model(
        config, cfg.device, getattr(torch, cfg.engine_dtype), std=cfg.decode_std, seed=cfg.seed
    )
    prompt = random_prompts(1, cfg.engine_prompt_len, vocab, seed=cfg.seed + 5)[0]
    n = cfg.engine_new_tokens
    timer = Timer(cfg.device)
    hf_greedy(model, prompt, min(n, 8))  # warm-up
    ms, ref = timer(hf_greedy, model, prompt, n)
    rows: dict[str, Any] = {
        "transformers eager": {"ms": ms, "tokens": len(ref), "tok_s": len(ref) / (ms / 1e3)}
    }
    if shape in cfg.engine_hf_compile_shapes:
        rows["transformers static compiled"] = hf_static_row(model, prompt, n, timer, ref)
    for name, method, params, inject in engine_specs(shape, cfg):
        rows[name] = row = our_row(model, method, params, inject, cfg, vocab, prompt, timer, ref)
        ok = "error" not in row and row["tokens"] == n and not row.get("compiles_while_timed")
        checks.append(check_entry(f"engine {shape}: {name} runs", ok, row.get("error")))
    add_ratios(rows)
    fast_ar = rows.get("ours fast ar", {})
    if "agree_with_transformers" in fast_ar and cfg.engine_dtype == "float32":
        what = f"engine {shape}: fast ar = transformers greedy ({cfg.engine_dtype}; bf16 may flip near-ties)"
        checks.append(check_entry(what, fast_ar["agree_with_transformers"]))
    try:
        curve: dict[int, float] | dict[str, str] = graph_curve(model, cfg, vocab)
    except Exception as e:  # noqa: BLE001 - the rows above stand without the curve
        curve = {"error": describe_error(e)}
    error = curve.get("error") if "error" in curve else None  # type: ignore[call-overload]  # the str-keyed variant
    checks.append(check_entry(f"engine {shape}: graph-mode t(w) curve", error is None, error))
    del model
    free()
    return {"rows": rows, "graph_curve_ms": curve}


def hf_static_row(model: Any, prompt: list[int], n: int, timer: Timer, ref: list[int]) -> dict[str, Any]:
    """transformers' compiled baseline: two untimed decodes (the first compiles), then a timed one, with the frames
    dynamo compiled while timed (a recompile there would charge the baseline its compile)."""
    try:
        t0 = time.perf_counter()
        hf_static(model, prompt, n)  # compiles
        hf_static(model, prompt, n)
        compile_s = time.perf_counter() - t0
        frames = _dynamo_frames()
        ms, toks = timer(hf_static, model, prompt, n)
        after = _dynamo_frames()
        return {
            "ms": ms,
            "tokens": len(toks),
            "tok_s": len(toks) / (ms / 1e3),
            "warmup_s": compile_s,
            "recompiles": None if frames < 0 else after - frames,
            "agree_with_transformers": toks == ref,
        }
    except Exception as e:  # noqa: BLE001 - reported, the other rows still run
        return {"error": describe_error(e)}


def engine_specs(shape: str, cfg: CheckConfig) -> list[EngineSpec]:
    """Our rows of one shape: reference and fast ar, fast prove-lossless unfused and fused, each injected acceptance
    unfused and fused alike, and on ``engine_compile_shapes`` the compiled cycle (does fusing its kernels pay?)."""
    unfused = {"fast": True, "block_size": cfg.block_size}
    fused = {**unfused, "fuse": True, "fuse_groups": "all"}
    kinds = (("", unfused), (" fused", fused))
    specs: list[EngineSpec] = [
        ("ours reference ar", "ar", {"fast": False}, None),
        ("ours fast ar", "ar", {"fast": True}, None),
        ("ours fast ar, request-sized cache", "ar", {"fast": True, "cache_len": cache_len(cfg)}, None),
        ("ours fast prove-lossless", "prove-lossless", unfused, None),
        ("ours fast prove-lossless fused", "prove-lossless", fused, None),
    ]
    for tpc in cfg.engine_injected:  # the same accepted counts for unfused and fused
        for label, params in kinds:
            name = f"ours fast prove-lossless{label}, {tpc:g} tok/cycle injected"
            specs.append((name, "prove-lossless", params, injected_counts(tpc)))
    if shape in cfg.engine_compile_shapes:
        top = max(cfg.engine_injected, default=None)
        specs.append(("ours fast ar compiled", "ar", {"fast": True, "compile": True}, None))
        for label, params in kinds:
            if top is not None:
                name = f"ours fast prove-lossless{label} compiled, {top:g} tok/cycle injected"
                specs.append((name, "prove-lossless", {**params, "compile": True}, injected_counts(top)))
    return specs


def our_row(
    model: Any, method: str, params: dict[str, Any], inject: list[int] | None, cfg: CheckConfig, vocab: int,
    prompt: list[int], timer: Timer, ref: list[int],
) -> dict[str, Any]:  # fmt: skip
    """One row of ours on the shape's model, its acceptance injected where ``inject`` is set; an error is the
    row's, not the shape's."""
    try:
        dec = _ours(model, method, params, cfg, vocab)
        if inject is not None:
            dec.fast_engine.set_rule(InjectedAcceptance(inject, dec.fast_engine.device))
        row = _row_of(dec, prompt, cfg.engine_new_tokens, timer, ref)
        if inject is not None:
            row["injected"] = inject
        return row
    except Exception as e:  # noqa: BLE001
        return {"error": describe_error(e)}


def add_ratios(rows: dict[str, Any]) -> None:
    """Each row's tok/s over transformers' compiled AR, and the default cache's cost against a request-sized one
    (the same passes, if views work)."""
    base = rows.get("transformers static compiled", {}).get("tok_s")
    for row in rows.values():
        if base and row.get("tok_s"):
            row["vs_transformers_compiled_ar"] = row["tok_s"] / base
    fast_ar = rows.get("ours fast ar", {})
    sized = rows.get("ours fast ar, request-sized cache", {})
    if fast_ar.get("tok_s") and sized.get("tok_s"):
        fast_ar["default_cache_over_request_sized"] = sized["tok_s"] / fast_ar["tok_s"]


def graph_curve(model: Any, cfg: CheckConfig, vocab: int) -> dict[int, float]:
    """Median ms of one pass of w tokens on a warm slot cache of ``cache_len`` tokens: a captured CUDA graph
    replayed on CUDA, the same pass eagerly elsewhere."""
    import torch
    from prove.decode.engine.cache import SlotCache, linear_mask

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    widths = sorted(set(cfg.widths))
    cache = SlotCache.for_model(model, cfg.cache_len + max(widths))
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    context = torch.randint(1, vocab - 1, (cfg.cache_len,), generator=gen).to(device)
    extra = torch.randint(1, vocab - 1, (max(widths),), generator=gen).to(device)
    start = torch.tensor(cfg.cache_len, device=device)
    timer = Timer(cfg.device)
    out: dict[int, float] = {}

    def pass_(ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        w = ids.shape[0]
        pos = at + torch.arange(w, device=device)
        cache.set_slots(pos)
        mask = linear_mask(at, w, cache.capacity, dtype)
        return model(
            input_ids=ids[None],
            position_ids=pos[None],
            past_key_values=cache,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=w,
        ).logits

    with torch.no_grad():
        pass_(context, torch.tensor(0, device=device))
        for w in widths:
            ids = extra[:w]
            if device.type == "cuda":
                stream = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        pass_(ids, start)
                torch.cuda.current_stream(device).wait_stream(stream)
                gc.collect()  # an earlier row's graph freed by the collector mid-capture invalidates the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    pass_(ids, start)
                times = [timer(graph.replay)[0] for _ in range(cfg.warmup + cfg.repeats)]
                del graph
            else:
                times = [timer(pass_, ids, start)[0] for _ in range(cfg.warmup + cfg.repeats)]
            out[w] = statistics.median(times[cfg.warmup :])
    return out


def run_engine(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Every shape of ``cfg.engine_shapes``; a shape that fails is reported and the others still run."""
    import torch
    from prove.recipes.gpu_check.curve import fits

    result: dict[str, Any] = {
        "dtype": cfg.engine_dtype,
        "new_tokens": cfg.engine_new_tokens,
        "prompt_len": cfg.engine_prompt_len,
        "block_size": cfg.block_size,
        "cache_len": cfg.cache_len,
        "fast_cache_slots": cache_len(cfg),
        "graphs": torch.device(cfg.device).type == "cuda",
        "hf_compile_shapes": list(cfg.engine_hf_compile_shapes),
        "note": (
            "Random weights, one request. Injected rows take each cycle's accepted count from a preloaded device "
            "buffer after the rule has run (the same counts unfused and fused; a fused cycle commits at most K "
            "tokens). Fused on the fast path: one tree of K² entries a cycle, every group, no second candidate. "
            "gpu_ms_per_cycle: back-to-back replays of the captured cycle (CUDA events)."
        ),
        "shapes": {},
    }

    for shape in cfg.engine_shapes:
        ok, why = fits(shape_config(SHAPES[shape]), cfg, getattr(torch, cfg.engine_dtype))
        if not ok:
            result["shapes"][shape] = {"skipped": why}
            continue
        try:
            result["shapes"][shape] = run_shape(shape, cfg, checks)
        except Exception as e:  # noqa: BLE001
            result["shapes"][shape] = {"error": describe_error(e)}
            checks.append(check_entry(f"engine {shape}: ran", False, result["shapes"][shape]["error"]))
        free()
    return result


__all__ = ["SHAPES", "graph_curve", "injected_counts", "run_engine", "run_shape"]
