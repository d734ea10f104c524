"""Part 1, train: MARS steps on a real shape, FlexAttention ``BlockMask`` against the dense float mask.

The step is ``MarsTrainer.compute_loss``'s own, ``prove.train.mars_step.MarsStep`` (the noisy blocks from (P − 1) // K on,
the head and the CE at targets only), with the mask ``stage.attention=mask`` builds for each attention; the model is a random-weight one of ``train_shape`` (``prove.decode.random_models``). Both attention paths start from
the same weights and read the same batches: the first step's losses must agree to the dtype's tolerance, and every
gradient must be finite. A plain causal-LM step on the same rows and weights (the model's own loss: the head at every
position, the CE at the labelled tokens; the ``dense_attn`` attention with transformers' causal mask) sets the
baseline: ``mars_over_plain`` is each MARS path's step time over the plain one (the issue's ≤ 1.3× target, read on the
GPU with the ``BlockMask``).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any

from prove.decode.random_models import random_model, shape_config
from prove.recipes.gpu_check.config import SHAPES, CheckConfig
from prove.recipes.gpu_check.runtime import check_entry, describe_error, free, peak_gib, peak_reset, sync

if TYPE_CHECKING:
    from prove.train.mars_step import MarsStep


def train_batches(cfg: CheckConfig, vocab: int, mask_id: int, device: str) -> list[tuple[Any, Any]]:
    """Random examples: a prompt (label -100) then a response (labelled), one fixed batch per step."""
    import torch
    from prove.train.masks import IGNORE_INDEX

    gen = torch.Generator().manual_seed(cfg.seed + 7)
    out = []
    for _ in range(cfg.train_steps):
        ids = torch.randint(0, mask_id, (cfg.train_batch, cfg.train_len), generator=gen)  # (B, L)
        labels = ids.clone()
        prompt = torch.randint(1, cfg.train_len // 2, (cfg.train_batch,), generator=gen)  # (B,)
        labels[torch.arange(cfg.train_len)[None] < prompt[:, None]] = IGNORE_INDEX
        out.append((ids.to(device), labels.to(device)))
    return out


CE_CHUNK_ROWS = 4096
"""The head and its cross-entropy this many targets at a time (``stage.ce_chunk_rows``)."""


def mars_step(impl: str, block_size: int, mask_id: int) -> MarsStep:
    """The trainer's step (:class:`prove.train.mars_step.MarsStep`, as ``MarsTrainer.compute_loss`` runs it) on a model
    whose attention is ``impl``, with the mask ``stage.attention=mask`` builds for it (a FlexAttention ``BlockMask``
    under ``flex_attention``, else the dense float mask), MARS's uniform loss, the mask built every step (its time is
    the step's)."""
    from prove.train.mars_step import MarsStep

    return MarsStep(mask_id, block_size, impl, ce_chunk_rows=CE_CHUNK_ROWS)


def train_one(cfg: CheckConfig, impl: str, batches: list[tuple[Any, Any]], mask_id: int) -> dict[str, Any]:
    """``train_steps`` AdamW steps of the MARS loss with attention ``impl``; losses, grad norms, speed, memory."""
    import torch

    dtype = getattr(torch, cfg.train_dtype)
    # FlexAttention has no backward on CPU (torch raises): there the --tiny run checks its forward only.
    backward = not (impl == "flex_attention" and torch.device(cfg.device).type == "cpu")
    config = shape_config(SHAPES[cfg.train_shape], attn=impl, pad_token_id=0)
    model = random_model(config, cfg.device, dtype, seed=cfg.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    step = mars_step(impl, cfg.block_size, mask_id)
    mask = None
    losses: list[float] = []
    grad_norms: list[float] = []
    finite = True
    step_ms: list[float] = []
    peak_reset(cfg.device)
    for ids, labels in batches:
        sync(cfg.device)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):
            out = step.loss(model, model, {"input_ids": ids, "labels": labels})
            loss, mask = out.loss, out.at.mask
        losses.append(loss.item())
        if backward:
            norm = optimizer_step(model, opt, loss)
            finite = finite and math.isfinite(norm)
            grad_norms.append(norm)
        sync(cfg.device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        del out, loss
    timed = step_ms[1:] or step_ms  # the first step compiles FlexAttention (and warms up kernels)
    tokens = cfg.train_batch * cfg.train_len
    result = {
        "attn_implementation": impl,
        "mask": type(mask).__name__,
        "backward": backward,
        "losses": losses,
        "grad_norms": grad_norms,
        "grads_finite": finite,
        "first_step_ms": step_ms[0],
        "step_ms": statistics.median(timed),
        "tokens_per_s": tokens / (statistics.median(timed) / 1e3),
        "peak_gib": peak_gib(cfg.device),
    }
    del model, opt, mask
    free()
    return result


def optimizer_step(model: Any, opt: Any, loss: Any) -> float:
    """Backward, then one optimizer step: the global gradient norm (NaN when no parameter got a gradient)."""
    import torch

    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return float("nan")
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


def train_plain(cfg: CheckConfig, impl: str, batches: list[tuple[Any, Any]]) -> dict[str, Any]:
    """``train_steps`` AdamW steps of a plain causal-LM step on the same rows and starting weights as
    :func:`train_one`: ``model(input_ids, labels)`` (the CE at the labelled tokens, the head at every position), attention
    ``impl``; losses, grad norms, speed, memory."""
    import torch

    dtype = getattr(torch, cfg.train_dtype)
    config = shape_config(SHAPES[cfg.train_shape], attn=impl, pad_token_id=0)
    model = random_model(config, cfg.device, dtype, seed=cfg.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    losses: list[float] = []
    grad_norms: list[float] = []
    finite = True
    step_ms: list[float] = []
    peak_reset(cfg.device)
    for ids, labels in batches:
        sync(cfg.device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        losses.append(loss.item())
        norm = optimizer_step(model, opt, loss)
        finite = finite and math.isfinite(norm)
        grad_norms.append(norm)
        sync(cfg.device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        del loss
    timed = step_ms[1:] or step_ms  # the first step warms up kernels
    tokens = cfg.train_batch * cfg.train_len
    result = {
        "attn_implementation": impl,
        "mask": "causal (plain step)",
        "backward": True,
        "losses": losses,
        "grad_norms": grad_norms,
        "grads_finite": finite,
        "first_step_ms": step_ms[0],
        "step_ms": statistics.median(timed),
        "tokens_per_s": tokens / (statistics.median(timed) / 1e3),
        "peak_gib": peak_gib(cfg.device),
    }
    del model, opt
    free()
    return result


def run_train(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Both attention paths (FlexAttention where torch has it, then the dense mask); appends their checks."""
    vocab = SHAPES[cfg.train_shape]["vocab_size"]
    mask_id = vocab - 1  # a spare embedding row stands in for <|mask|>
    batches = train_batches(cfg, vocab, mask_id, cfg.device)
    impls, flex_note = attention_impls(cfg)
    runs = {impl: mars_path(cfg, impl, batches, mask_id, checks) for impl in impls}
    plain = plain_path(cfg, batches, checks)
    result: dict[str, Any] = {
        "shape": cfg.train_shape,
        "dtype": cfg.train_dtype,
        "batch": cfg.train_batch,
        "length": cfg.train_len,
        "block_size": cfg.block_size,
        "steps": cfg.train_steps,
        "runs": runs,
        "plain": plain,
        "mars_over_plain": {
            impl: r["step_ms"] / plain["step_ms"]
            for impl, r in runs.items()
            if "error" not in r and r["backward"] and "error" not in plain
        },
        "note": flex_note,
    }
    if len(runs) == 2 and all("error" not in r for r in runs.values()):
        result.update(flex_against_dense(cfg, runs, checks))
    return result


def attention_impls(cfg: CheckConfig) -> tuple[list[str], str | None]:
    """The attentions to train with: FlexAttention first where ``cfg.flex`` asks and torch has it (else a note
    why not), then ``cfg.dense_attn``."""
    import torch

    if not cfg.flex:
        return [cfg.dense_attn], None
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError as e:
        return [cfg.dense_attn], f"FlexAttention unavailable in torch {torch.__version__}: {e}"
    return ["flex_attention", cfg.dense_attn], None


def mars_path(
    cfg: CheckConfig, impl: str, batches: list[tuple[Any, Any]], mask_id: int, checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """:func:`train_one` with attention ``impl`` and its check (one path failing must not hide the other)."""
    try:
        r = train_one(cfg, impl, batches, mask_id)
    except Exception as e:
        r = {"attn_implementation": impl, "error": describe_error(e)}
    free()
    ok = "error" not in r and r["grads_finite"]
    what = f"train {impl}: steps run, gradients finite"
    if "error" not in r and not r["backward"]:
        what = f"train {impl}: forward runs (no backward on {cfg.device})"
    checks.append(check_entry(what, ok, r.get("error")))
    return r


def plain_path(
    cfg: CheckConfig, batches: list[tuple[Any, Any]], checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """:func:`train_plain`, the baseline, with the dense attention and its check."""
    try:
        plain = train_plain(cfg, cfg.dense_attn, batches)
    except Exception as e:
        plain = {"attn_implementation": cfg.dense_attn, "error": describe_error(e)}
    free()
    ok = "error" not in plain and plain["grads_finite"]
    what = f"train plain causal LM ({cfg.dense_attn}): steps run, gradients finite"
    checks.append(check_entry(what, ok, plain.get("error")))
    return plain


def flex_against_dense(
    cfg: CheckConfig, runs: dict[str, Any], checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """Same weights and batches: the FlexAttention ``BlockMask`` path's step-1 loss must equal the dense mask's
    to the dtype's tolerance (later steps drift apart with the rounding of updates)."""
    tol = 2e-2 if cfg.train_dtype in ("bfloat16", "float16") else 1e-4
    flex, dense = runs["flex_attention"]["losses"], runs[cfg.dense_attn]["losses"]
    rel = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(flex, dense, strict=True)]
    out: dict[str, Any] = {"loss_rel_diff": rel, "loss_tolerance": tol}
    gf, gd = runs["flex_attention"]["grad_norms"], runs[cfg.dense_attn]["grad_norms"]
    if gf and gd:
        out["grad_norm_rel_diff_step1"] = abs(gf[0] - gd[0]) / max(gd[0], 1e-12)
    kind = runs["flex_attention"]["mask"]
    what = (
        f"train: FlexAttention ({kind}) loss = dense-mask loss at step 1 (rel. diff {rel[0]:.2e} ≤ {tol:g})"
    )
    checks.append(check_entry(what, rel[0] <= tol and kind == "BlockMask"))
    return out
