"""Part 3, curve: t(w), the latency of one engine pass (``ModelRunner.forward``) of w tokens on a warm KV cache.

For each shape in ``shapes`` (smallest first) a random-weight model in bf16 (fp32 with ``--tiny``) feeds
``cache_len`` tokens once, then every width ``warmup + repeats`` times, timed with CUDA events; the median
counts. A shape whose weights and headroom do not fit the device's free memory is skipped, and the report
says so; one that fails (out of memory) does not stop the others.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from prove.decode.random_models import param_bytes, random_model, shape_config
from prove.recipes.gpu_check.config import SHAPES, CheckConfig
from prove.recipes.gpu_check.runtime import Timer, check_entry, describe_error, free


def time_widths(model: Any, cfg: CheckConfig, vocab: int) -> dict[int, float]:
    """Median ms of one engine pass of w tokens on a warm cache of ``cache_len`` tokens, for each width."""
    import torch
    from prove.decode.engine import ModelRunner

    runner = ModelRunner(model)
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    context = torch.randint(1, vocab - 1, (cfg.cache_len,), generator=gen).tolist()
    extra = torch.randint(1, vocab - 1, (max(cfg.widths),), generator=gen).tolist()
    timer = Timer(cfg.device)
    out: dict[int, float] = {}
    with torch.inference_mode():
        runner.forward(context)  # the prompt: fills the cache
        for w in sorted(set(cfg.widths)):
            # [last context token, w − 1 more]: the runner re-feeds the last token and crops back to cache_len − 1
            times = [
                timer(runner.forward, context, extra[: w - 1])[0] for _ in range(cfg.warmup + cfg.repeats)
            ]
            out[w] = statistics.median(times[cfg.warmup :])
    del runner
    return out


def fits(config: Any, cfg: CheckConfig, dtype: Any) -> tuple[bool, str]:
    """Whether a shape's weights plus headroom fit the device's free memory (always on CPU)."""
    import torch

    need = param_bytes(config, dtype)
    if torch.device(cfg.device).type != "cuda":
        return True, f"{need / 2**30:.1f} GiB of weights"
    free_b, total = torch.cuda.mem_get_info(torch.device(cfg.device))
    logits = 4 * max(cfg.widths) * config.vocab_size * 3
    headroom = 2 * 2**30 + 0.05 * total + logits
    ok = need + headroom <= free_b
    return (
        ok,
        f"{need / 2**30:.1f} GiB of weights + {headroom / 2**30:.1f} GiB headroom vs {free_b / 2**30:.1f} GiB free",
    )


def run_curve(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """t(w) of every shape that fits, in ms by width; appends a check per shape."""
    import torch

    dtype = torch.float32 if cfg.tiny else torch.bfloat16
    curves: dict[str, dict[int, float]] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    sizes = {s: param_bytes(shape_config(SHAPES[s]), dtype) for s in set(cfg.shapes)}
    for shape in sorted(sizes, key=sizes.__getitem__):
        config = shape_config(SHAPES[shape], attn="sdpa", pad_token_id=0)
        ok, why = fits(config, cfg, dtype)
        if not ok:
            skipped[shape] = f"does not fit: {why}"
            print(f"gpu-check: skipping {shape}: {skipped[shape]}", file=sys.stderr)
            continue
        print(f"gpu-check: cost curve of {shape} ({why})", file=sys.stderr, flush=True)
        model = None
        try:
            model = random_model(config, cfg.device, dtype, seed=cfg.seed)
            curves[shape] = time_widths(model, cfg, config.vocab_size)
        except Exception as e:  # e.g. out of memory: the other shapes still run
            errors[shape] = describe_error(e)
        model = None  # outside the except block, whose traceback holds the frames that hold the model
        free()
        checks.append(check_entry(f"curve {shape}: timed", shape in curves, errors.get(shape)))
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "cache_len": cfg.cache_len,
        "warmup": cfg.warmup,
        "repeats": cfg.repeats,
        "param_bytes": sizes,
        "ms": {s: {str(w): t for w, t in c.items()} for s, c in curves.items()},
        "skipped": skipped,
        "errors": errors,
    }
