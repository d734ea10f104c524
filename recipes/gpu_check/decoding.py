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


def decode_dtype(
    cfg: CheckConfig, dtype_name: str, specs: list[DecodeSpec], checks: list[dict[str, Any]]
) -> dict:
    """Every row of ``specs`` in one dtype, timed prompt by prompt after a warm-up; appends their checks."""
    from prove.decode.bench.metrics import first_divergence, rate_by_depth
    from prove.decode.decoder import Decoder

    vocab = SHAPES[cfg.decode_shape]["vocab_size"]
    target, draft = random_target_and_draft(
        SHAPES[cfg.decode_shape],
        cfg.decode_draft_layers,
        seed=cfg.seed,
        dtype=dtype_name,
        device=cfg.device,
        std=cfg.decode_std,
    )
    n = cfg.decode_new_tokens
    lo, hi = (4, 8) if cfg.tiny else (16, 48)
    prompts = prompt_ids(cfg.decode_prompts, vocab, lo, hi, cfg.seed + 1)
    timer = Timer(cfg.device)
    hf_greedy(target, prompts[0], min(n, 8))  # warm-up
    ref: list[list[int]] = []
    ref_ms = 0.0
    for p in prompts:
        ms, tokens = timer(hf_greedy, target, p, n)
        ref_ms += ms
        ref.append(tokens)
    rows: dict[str, Any] = {"hf-greedy": {"ms": ref_ms, "tokens": sum(map(len, ref))}}
    distinct = len({t for r in ref for t in r})
    for spec in specs:
        params = dict(spec.params)
        row: dict[str, Any] = {"method": spec.method, "params": params, "lossless": spec.lossless}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no prove.json: "records no trained block size"
                models = {
                    "draft": draft if spec.draft else None,
                    "verifier": draft if spec.verifier else None,
                    "mask_token_id": vocab - 1 if spec.block else None,
                    "device": cfg.device,
                }
                if spec.method == "prove":
                    at = {"mask_token_id": vocab - 1, "device": cfg.device, **spec.params}
                    params["theta"] = prove_theta(target, draft, prompts[0], n, **at)
                dec = Decoder(target, None, method=spec.method, **models, **params)
                ref_dec = (  # in fp32, where it is checked (the reference loop is the slow part of a row)
                    Decoder(target, None, method=spec.method, **models, **{**params, "fast": False})
                    if spec.against_reference and dtype_name == "float32"
                    else None
                )
            dec.generate(prompts[0], max_new_tokens=min(n, 8))  # warm-up
            outs, stats, ms = [], [], 0.0
            for i, p in enumerate(prompts):
                t, res = timer(dec.generate, p, max_new_tokens=n, seed=cfg.seed + i)
                ms += t
                outs.append(res.token_ids)
                stats.append(res.stats)
            tokens = sum(map(len, outs))
            div = [first_divergence(o, r) for o, r in zip(outs, ref, strict=True)]
            row.update(
                ms=ms,
                tokens=tokens,
                valid=all(len(o) == n and all(0 <= t < vocab for t in o) for o in outs),
                tokens_per_cycle=tokens / max(1, sum(s.cycles for s in stats)),
                model_passes_per_token=sum(s.model_passes for s in stats) / max(1, tokens),
                draft_passes_per_token=sum(s.draft_passes for s in stats) / max(1, tokens),
                acceptance_by_depth=rate_by_depth(
                    (s.accepted_by_depth for s in stats), (s.proposed_by_depth for s in stats)
                ),
                agreement=sum(d is None for d in div) / len(div),
                first_divergence=div,
                path="fast" if all(s.fast is not None for s in stats) else "reference",
            )
            if ref_dec is not None:
                theirs = [ref_dec.generate(p, max_new_tokens=n).token_ids for p in prompts]
                row["agreement_with_reference"] = sum(
                    o == t for o, t in zip(outs, theirs, strict=True)
                ) / len(outs)
        except Exception as e:
            row["error"] = describe_error(e)
        rows[spec.name] = row
        forced = (
            spec.params.get("fast") is True
        )  # the row is there to check the fast cycle: it must have run it
        what = f"decode {dtype_name} {spec.name}: runs on {cfg.device}" + (" (fast path)" if forced else "")
        ran = "error" not in row and row["valid"] and (not forced or row["path"] == "fast")
        checks.append(check_entry(what, ran, row.get("error")))
        if spec.lossless and dtype_name == "float32" and "error" not in row:
            checks.append(
                check_entry(
                    f"decode float32 {spec.name} = transformers generate, token for token "
                    f"({row['agreement']:.0%} of {len(prompts)} prompts)",
                    row["agreement"] == 1.0,
                )
            )
        if spec.against_reference and dtype_name == "float32" and "error" not in row:
            checks.append(
                check_entry(
                    f"decode float32 {spec.name} = our reference path (fast=false), token for token "
                    f"({row['agreement_with_reference']:.0%} of {len(prompts)} prompts)",
                    row["agreement_with_reference"] == 1.0,
                )
            )
    ar_ms = rows.get("ar", {}).get("ms")
    for row in rows.values():
        if ar_ms and row.get("ms") and row.get("tokens"):
            row["speedup_vs_ar"] = ar_ms / row["ms"] * row["tokens"] / rows["ar"]["tokens"]
    del target, draft
    free()
    return {"prompts": len(prompts), "new_tokens": n, "distinct_reference_tokens": distinct, "rows": rows}


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
