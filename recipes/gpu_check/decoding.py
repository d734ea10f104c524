"""Part 2, decode: every method through :class:`prove.decode.Decoder` on the device, the lossless ones against
transformers' greedy ``generate``.

The target is a random-weight model of ``decode_shape`` and the draft of sd / nsd / asd / pard and prove's verifier a
layer-skip cut of it (its embeddings, first ``decode_draft_layers`` layers and head, shared:
``prove.decode.random_models``). In fp32 every lossless row must equal ``generate`` token for token, and the greedy
rows that are not lossless (prove, asd) our reference path (``fast=false``) on the same weights (compared in fp32
only); in bf16 the lossless rows' agreement is reported (batch-shape-dependent numerics can flip near-ties). The
rows of the fast path's later cycles (sampled ar, prove, pard, greedy asd) force ``fast=true``, so they check the
fast cycle on any device (on the CPU of ``--tiny`` too, where ``fast=auto`` would take the reference path).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from prove.decode.random_models import random_target_and_draft
from prove.recipes.gpu_check.config import SHAPES, CheckConfig
from prove.recipes.gpu_check.runtime import Timer, check_entry, describe_error, free


@dataclass(frozen=True)
class DecodeSpec:
    """One row of the decode check."""

    name: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    lossless: bool = False
    """Greedy and exact: must equal transformers' greedy ``generate`` (in fp32)."""
    draft: bool = False
    """The layer-skip cut is the method's draft (sd, nsd, asd; pard's block draft)."""
    block: bool = False
    verifier: bool = False
    """The layer-skip cut is prove's small verifier."""
    against_reference: bool = False
    """Greedy but not lossless: must equal our reference path (``fast=false``) on the same weights (in fp32)."""


def decode_specs(block_size: int, k: int = 5) -> list[DecodeSpec]:
    """The decode check's rows. prove's θ is set per run (``prove_theta``)."""
    sample = {"temperature": 1.0, "top_p": 0.95}
    fused = {"block_size": block_size, "fuse": True, "fuse_groups": "all"}
    fast = {"fast": True}
    return [
        DecodeSpec("ar", "ar", lossless=True),
        DecodeSpec("prove-lossless", "prove-lossless", {"block_size": block_size}, lossless=True, block=True),
        DecodeSpec("prove-lossless fused", "prove-lossless", fused, lossless=True, block=True),
        DecodeSpec("sd", "sd", {"k": k}, lossless=True, draft=True),
        DecodeSpec("sd sampling", "sd", {"k": k, **sample}, draft=True),
        DecodeSpec("nsd sampling", "nsd", {"k": k, **sample}, draft=True),
        DecodeSpec("ar sampling", "ar", {**sample, **fast}),
        DecodeSpec("pard", "pard", {"block_size": block_size, **fast}, lossless=True, draft=True, block=True),
        DecodeSpec("asd", "asd", {"k": k, **fast}, draft=True, against_reference=True),
        DecodeSpec(
            "prove",
            "prove",
            {"block_size": block_size, **fast},
            block=True,
            verifier=True,
            against_reference=True,
        ),
    ]


def prove_theta(target: Any, verifier: Any, prompt: list[int], n: int, **params: Any) -> float:
    """A θ for the prove row that cuts blocks whatever the shape (random weights put p̃·q anywhere): between the two
    middle distinct values of p̃_i·q_i (i ≥ 2) in a θ = 0 decode of ``prompt`` on the reference path, so no score
    of that decode sits on it (the last bit of a float, which the two paths may round apart, cannot flip its tests)."""
    from prove.decode.decoder import Decoder

    params = {**params, "fast": False, "theta": 0.0}
    dec = Decoder(target, None, method="prove", verifier=verifier, trace=True, **params)
    trace = dec.generate(prompt, max_new_tokens=n).stats.trace or []
    scores = sorted(
        {c * q for row in trace for c, q in zip(row["conf"][1:], row["verifier_prob"][1:], strict=True)}
    )
    if len(scores) < 2:
        return 0.0
    i = len(scores) // 2
    return (scores[i - 1] * scores[i]) ** 0.5


def prompt_ids(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """``n`` prompts of lo..hi random ids, never 0 (the pad id) or vocab − 1 (the stand-in ``<|mask|>``)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return [torch.randint(1, vocab - 1, (n_,), generator=gen).tolist() for n_ in lengths]


def hf_greedy(model: Any, prompt: list[int], n: int, **generate_kwargs: Any) -> list[int]:
    """transformers' greedy ``generate``: the reference every lossless row must equal (``generate_kwargs``: e.g.
    ``cache_implementation="static"``, the compiled baseline of gpu-check's engine part)."""
    import torch

    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            **generate_kwargs,
        )
    return out[0, len(prompt) :].tolist()


@dataclass
class DecodeRun:
    """What every row of one dtype shares: the models, the prompts, transformers' greedy tokens for them."""

    cfg: CheckConfig
    dtype_name: str
    target: Any
    draft: Any
    vocab: int
    prompts: list[list[int]]
    timer: Timer
    reference: list[list[int]] = field(default_factory=list)
    """transformers' greedy ``generate`` per prompt: what a lossless row must equal."""

    @property
    def n(self) -> int:
        return self.cfg.decode_new_tokens

    @property
    def checked(self) -> bool:
        """Token-for-token checks run in fp32 only (bf16's batch-shape-dependent numerics can flip near-ties)."""
        return self.dtype_name == "float32"


def decode_dtype(
    cfg: CheckConfig, dtype_name: str, specs: list[DecodeSpec], checks: list[dict[str, Any]]
) -> dict:
    """Every row of ``specs`` in one dtype, timed prompt by prompt after a warm-up; appends their checks."""
    run = start_run(cfg, dtype_name)
    rows: dict[str, Any] = {"hf-greedy": time_reference(run)}
    distinct = len({t for r in run.reference for t in r})
    for spec in specs:
        rows[spec.name] = row = measure_row(run, spec)
        checks += row_checks(run, spec, row)
    add_speedups(rows)
    n_prompts = len(run.prompts)
    del run
    free()
    return {
        "prompts": n_prompts,
        "new_tokens": cfg.decode_new_tokens,
        "distinct_reference_tokens": distinct,
        "rows": rows,
    }


def start_run(cfg: CheckConfig, dtype_name: str) -> DecodeRun:
    """The random target and its layer-skip draft in ``dtype_name`` on the device, and the seeded prompts."""
    vocab = SHAPES[cfg.decode_shape]["vocab_size"]
    target, draft = random_target_and_draft(
        SHAPES[cfg.decode_shape],
        cfg.decode_draft_layers,
        seed=cfg.seed,
        dtype=dtype_name,
        device=cfg.device,
        std=cfg.decode_std,
    )
    lo, hi = (4, 8) if cfg.tiny else (16, 48)
    prompts = prompt_ids(cfg.decode_prompts, vocab, lo, hi, cfg.seed + 1)
    return DecodeRun(cfg, dtype_name, target, draft, vocab, prompts, Timer(cfg.device))


def time_reference(run: DecodeRun) -> dict[str, Any]:
    """transformers' greedy tokens for every prompt (kept in ``run.reference``), timed after a warm-up."""
    hf_greedy(run.target, run.prompts[0], min(run.n, 8))  # warm-up
    ms = 0.0
    for p in run.prompts:
        t, tokens = run.timer(hf_greedy, run.target, p, run.n)
        ms += t
        run.reference.append(tokens)
    return {"ms": ms, "tokens": sum(map(len, run.reference))}


def decoders(run: DecodeRun, spec: DecodeSpec, params: dict[str, Any]) -> tuple[Any, Any]:
    """The row's decoder, and our reference path's (``fast=false``) where the row is checked against it, in fp32
    (the reference loop is the slow part of a row). prove's θ goes into ``params`` (:func:`prove_theta`)."""
    from prove.decode.decoder import Decoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no prove.json: "records no trained block size"
        models = {
            "draft": run.draft if spec.draft else None,
            "verifier": run.draft if spec.verifier else None,
            "mask_token_id": run.vocab - 1 if spec.block else None,
            "device": run.cfg.device,
        }
        if spec.method == "prove":
            at = {"mask_token_id": run.vocab - 1, "device": run.cfg.device, **spec.params}
            params["theta"] = prove_theta(run.target, run.draft, run.prompts[0], run.n, **at)
        dec = Decoder(run.target, None, method=spec.method, **models, **params)
        if not (spec.against_reference and run.checked):
            return dec, None
        return dec, Decoder(run.target, None, method=spec.method, **models, **{**params, "fast": False})


def measure_row(run: DecodeRun, spec: DecodeSpec) -> dict[str, Any]:
    """One row: its decoder over every prompt (timed, after a warm-up), measured against the reference tokens and,
    for a greedy lossy row, against our reference path; an error is the row's, not the run's."""
    params = dict(spec.params)
    row: dict[str, Any] = {"method": spec.method, "params": params, "lossless": spec.lossless}
    try:
        dec, ref_dec = decoders(run, spec, params)
        dec.generate(run.prompts[0], max_new_tokens=min(run.n, 8))  # warm-up
        outs, stats, ms = [], [], 0.0
        for i, p in enumerate(run.prompts):
            t, res = run.timer(dec.generate, p, max_new_tokens=run.n, seed=run.cfg.seed + i)
            ms += t
            outs.append(res.token_ids)
            stats.append(res.stats)
        row.update(ms=ms, **row_measures(run, outs, stats))
        if ref_dec is not None:
            theirs = [ref_dec.generate(p, max_new_tokens=run.n).token_ids for p in run.prompts]
            row["agreement_with_reference"] = sum(o == t for o, t in zip(outs, theirs, strict=True)) / len(
                outs
            )
    except Exception as e:
        row["error"] = describe_error(e)
    return row


def row_measures(run: DecodeRun, outs: list[list[int]], stats: list[Any]) -> dict[str, Any]:
    """A row's tokens, validity, tokens per cycle, passes per token, acceptance by depth, agreement with generate
    and first divergences, and the path its cycles took."""
    from prove.decode.bench.metrics import first_divergence, rate_by_depth

    tokens = sum(map(len, outs))
    div = [first_divergence(o, r) for o, r in zip(outs, run.reference, strict=True)]
    return {
        "tokens": tokens,
        "valid": all(len(o) == run.n and all(0 <= t < run.vocab for t in o) for o in outs),
        "tokens_per_cycle": tokens / max(1, sum(s.cycles for s in stats)),
        "model_passes_per_token": sum(s.model_passes for s in stats) / max(1, tokens),
        "draft_passes_per_token": sum(s.draft_passes for s in stats) / max(1, tokens),
        "acceptance_by_depth": rate_by_depth(
            (s.accepted_by_depth for s in stats), (s.proposed_by_depth for s in stats)
        ),
        "agreement": sum(d is None for d in div) / len(div),
        "first_divergence": div,
        "path": "fast" if all(s.fast is not None for s in stats) else "reference",
    }


def row_checks(run: DecodeRun, spec: DecodeSpec, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row ran (on the fast path where it forces it); in fp32, a lossless row equals generate and a greedy lossy
    one our reference path, token for token."""
    forced = spec.params.get("fast") is True  # the row is there to check the fast cycle: it must have run it
    what = f"decode {run.dtype_name} {spec.name}: runs on {run.cfg.device}" + (
        " (fast path)" if forced else ""
    )
    ran = "error" not in row and row["valid"] and (not forced or row["path"] == "fast")
    checks = [check_entry(what, ran, row.get("error"))]
    if not run.checked or "error" in row:
        return checks
    of = f"of {len(run.prompts)} prompts"
    if spec.lossless:
        what = f"decode float32 {spec.name} = transformers generate, token for token ({row['agreement']:.0%} {of})"
        checks.append(check_entry(what, row["agreement"] == 1.0))
    if spec.against_reference:
        agree = row["agreement_with_reference"]
        what = f"decode float32 {spec.name} = our reference path (fast=false), token for token ({agree:.0%} {of})"
        checks.append(check_entry(what, agree == 1.0))
    return checks


def add_speedups(rows: dict[str, Any]) -> None:
    """Each timed row's speedup over the ar row, per token (rows may differ in tokens)."""
    ar_ms = rows.get("ar", {}).get("ms")
    for row in rows.values():
        if ar_ms and row.get("ms") and row.get("tokens"):
            row["speedup_vs_ar"] = ar_ms / row["ms"] * row["tokens"] / rows["ar"]["tokens"]


def run_decode(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows of ``cfg.methods`` (all by default) in fp32, and in bf16 too on the real check."""
    specs = decode_specs(cfg.block_size, cfg.sd_k)
    if cfg.methods is not None:
        known = [s.name for s in specs]
        unknown = set(cfg.methods) - set(known)
        if unknown:
            raise ValueError(f"--methods {sorted(unknown)}: pick from {known}")
        specs = [s for s in specs if s.name in cfg.methods]
    result: dict[str, Any] = {
        "shape": cfg.decode_shape,
        "draft_layers": cfg.decode_draft_layers,
        "weight_std": cfg.decode_std,
        "block_size": cfg.block_size,
        "k": cfg.sd_k,
        "dtypes": {},
    }
    dtypes = ("float32",) if cfg.tiny else ("float32", "bfloat16")
    for dt in dtypes:
        result["dtypes"][dt] = decode_dtype(cfg, dt, specs, checks)
    return result
