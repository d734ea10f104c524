"""``python -m prove.recipes.gpu_check`` (``make gpu-check``): proves the GPU path and measures what decides speed.

One command, one report (``gpu-check.json``, ``gpu-check.md``, ``cost_curve.png`` in ``--out``), in a few
minutes on one CUDA GPU. Every model is a random-weight Qwen2 of a real shape built in-process: nothing is
downloaded, so it runs on a machine without internet.

1. **train** — a few MARS steps (``prove.train.masks`` / ``prove.train.losses``, the inputs, mask and loss
   that ``MarsTrainer`` uses) on a Qwen2.5-0.5B-shaped model in bf16, once with the FlexAttention
   ``BlockMask`` (``attn_implementation="flex_attention"``: transformers compiles ``flex_attention``) and once
   with the dense float additive mask (sdpa), from the same weights on the same batches. Checks: the first
   step's losses agree to bf16 tolerance, every gradient is finite; reports tokens/s and peak memory.
2. **decode** — ar, prove-lossless (and its fused form where the Decoder has one), greedy sd, and sampling
   sd / nsd run through :class:`prove.decode.Decoder` on the device. In fp32 the lossless methods must equal
   transformers' greedy ``generate`` token for token; in bf16 their agreement with ``generate`` (bf16 too) is
   reported (batch-shape-dependent numerics can flip near-ties).
3. **curve** — the cost curve t(w): the latency of one engine pass (``ModelRunner.forward``) of w tokens on
   a warm KV cache of 512 tokens, w = 1, 2, 4, …, 256, for Qwen2.5-0.5B/3B/7B/32B shapes in bf16, timed
   with CUDA events after warm-up. A shape that does not fit the GPU's free memory is skipped, and the
   report says so. From t(w) and per-depth acceptance rates (the demo's, shipped in
   ``gpu_check_acceptance.json``; ``--acceptance bench.json`` takes a ``prove-bench`` report of your own
   model and task) it predicts the speedup over AR of prove-lossless (unfused and fused), prove (with a
   3B-shaped verifier) and sd at k = 5 (with a 0.5B-shaped draft): :func:`predict`.

``--tiny`` runs the same code on CPU with tiny shapes in seconds (the test suite runs it, so the script
cannot rot). Without ``--tiny`` the check needs CUDA: on a machine without it, it says so in one line and
exits with status 2. It exits 1 when a check fails (the report still gets written) and 0 otherwise.

Imports: torch, transformers, and ``prove.decode`` / ``prove.train.masks`` / ``prove.train.losses``, which
need nothing more; matplotlib is optional (without it the plot is skipped, with a note). No hydra,
deepspeed, datasets, accelerate. So a GPU machine with torch and transformers runs it after
``pip install --no-deps --no-build-isolation -e .`` (or with no install at all: ``make gpu-check``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prove.decode.random_models import SHAPES as REAL_SHAPES

SCHEMA = "prove-gpu-check/1"
ACCEPTANCE_DEFAULT = Path(__file__).with_name("gpu_check_acceptance.json")

# The Qwen2.5 sizes from the one table of real shapes (prove.decode.random_models), and tiny CPU stand-ins.
SHAPES: dict[str, dict[str, Any]] = {
    **{name: spec for name, spec in REAL_SHAPES.items() if name.startswith("qwen2.5-")},
    # --tiny: the same roles at CPU size (draft < verifier < targets).
    "tiny-s": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=256, tie_word_embeddings=True),
    "tiny-m": dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True),
    "tiny-l": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False),
}  # fmt: skip
PARTS = ("train", "decode", "curve")


@dataclass
class CheckConfig:
    """What one run does. The defaults are the real (CUDA) check; :func:`tiny_config` is the CPU smoke run."""

    device: str = "cuda"
    out: str = "outputs/gpu-check"
    parts: tuple[str, ...] = PARTS
    seed: int = 0
    tiny: bool = False
    # 1. train
    train_shape: str = "qwen2.5-0.5b"
    train_dtype: str = "bfloat16"
    train_steps: int = 6
    """Optimizer steps per attention path; the first one (FlexAttention's compile) is not timed."""
    train_batch: int = 4
    train_len: int = 512
    """Tokens per example (a multiple of block_size): the model reads 2 × train_len ([noisy | clean])."""
    block_size: int = 8
    flex: bool = True
    dense_attn: str = "sdpa"
    # 2. decode
    decode_shape: str = "qwen2.5-0.5b"
    decode_draft_layers: int = 6
    """The draft of sd / nsd: the decode model's embeddings, first layers and head (an early-exit model)."""
    decode_prompts: int = 6
    decode_new_tokens: int = 64
    decode_std: float = 0.05
    """Weight std of the decode models: larger than the 0.02 init, whose greedy output repeats one token."""
    methods: tuple[str, ...] | None = None
    """Names of :func:`decode_specs` to run; None = all (the fused row only where the Decoder has it)."""
    # 3. curve
    shapes: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-32b")
    draft_shape: str = "qwen2.5-0.5b"
    verifier_shape: str = "qwen2.5-3b"
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    cache_len: int = 512
    warmup: int = 3
    repeats: int = 10
    sd_k: int = 5
    acceptance: str | None = None
    """A prove-bench bench.json (or a file in gpu_check_acceptance.json's format); None = the demo's."""

    def __post_init__(self) -> None:
        unknown = set(self.parts) - set(PARTS)
        if unknown or not self.parts:
            raise ValueError(f"--parts {','.join(self.parts)}: pick from {','.join(PARTS)}")
        for name in {
            self.train_shape,
            self.decode_shape,
            self.draft_shape,
            self.verifier_shape,
            *self.shapes,
        }:
            if name not in SHAPES:
                raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        if self.train_len % self.block_size:
            raise ValueError(f"train_len={self.train_len} must be a multiple of block_size={self.block_size}")
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"widths={self.widths}: give positive widths, e.g. 1,2,4,8")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be ≥ 1 and warmup ≥ 0")


def tiny_config(**overrides: Any) -> CheckConfig:
    """The CPU smoke run: the same code with tiny shapes, a few steps, a few widths (seconds)."""
    base: dict[str, Any] = dict(
        device="cpu", tiny=True, train_shape="tiny-l", train_dtype="float32", train_steps=2, train_batch=2,
        train_len=16, block_size=4, flex=False, dense_attn="eager", decode_shape="tiny-l", decode_draft_layers=2,
        decode_prompts=2, decode_new_tokens=12, decode_std=0.3, shapes=("tiny-s", "tiny-m", "tiny-l"),
        draft_shape="tiny-s", verifier_shape="tiny-m", widths=(1, 2, 4, 8, 16), cache_len=16, warmup=1, repeats=2,
    )  # fmt: skip
    base.update(overrides)
    return CheckConfig(**base)


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------


def qwen2_config(shape: str, *, layers: int | None = None, attn: str = "sdpa") -> Any:
    """A ``Qwen2Config`` of a named shape (no EOS: generation always runs to max_new_tokens)."""
    from transformers import Qwen2Config

    kw = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, **SHAPES[shape]}
    if layers is not None:
        kw["num_hidden_layers"] = layers
    cfg = Qwen2Config(
        **kw,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg._attn_implementation = attn
    return cfg


def param_bytes(config: Any, dtype: Any) -> int:
    """Bytes of a model's parameters, counted on the meta device (no memory used)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def random_model(config: Any, device: str, dtype: Any, *, std: float = 0.02, seed: int = 0) -> Any:
    """A random-weight causal LM built directly on ``device`` in ``dtype``, in eval mode.

    Matrices are redrawn N(0, std) in ``dtype`` on the device from a generator seeded by ``seed``, in parameter
    order: two models of the same shape and seed are equal, and one with fewer layers shares the embeddings
    and the first layers (the decode check's early-exit draft). Norm weights stay 1, biases 0.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=config._attn_implementation
        )
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.startswith("lm_head"):
                p.normal_(0.0, std, generator=gen)
        head = model.get_output_embeddings()
        if head is not None and head.weight is not model.get_input_embeddings().weight:
            # an untied head is drawn last, so it is the same for any number of layers
            head.weight.normal_(0.0, std, generator=torch.Generator(device=device).manual_seed(seed + 1))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def free() -> None:
    """Collect garbage and return the CUDA cache (callers ``del`` their own references first)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Timer:
    """``(ms, result)`` of ``fn(*args, **kw)``: CUDA events on a CUDA device (after a synchronize), else
    perf_counter."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[float, Any]:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn(*args, **kw)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)), result
        t0 = time.perf_counter()
        result = fn(*args, **kw)
        return (time.perf_counter() - t0) * 1e3, result


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return None


# --------------------------------------------------------------------------------------------------
# 1. train: MARS steps, FlexAttention BlockMask vs dense float mask
# --------------------------------------------------------------------------------------------------


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


def train_one(cfg: CheckConfig, impl: str, batches: list[tuple[Any, Any]], mask_id: int) -> dict[str, Any]:
    """``train_steps`` AdamW steps of the MARS loss with attention ``impl``; losses, grad norms, speed, memory."""
    import torch
    from prove.train.losses import mars_loss
    from prove.train.masks import block_inputs, mars_attention_mask

    dtype = getattr(torch, cfg.train_dtype)
    # FlexAttention has no backward on CPU (torch raises): there the --tiny run checks its forward only.
    backward = not (impl == "flex_attention" and torch.device(cfg.device).type == "cpu")
    model = random_model(qwen2_config(cfg.train_shape, attn=impl), cfg.device, dtype, seed=cfg.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    mask = mars_attention_mask(impl, cfg.train_len, cfg.block_size, dtype, cfg.device)
    losses: list[float] = []
    grad_norms: list[float] = []
    finite = True
    step_ms: list[float] = []
    _peak_reset(cfg.device)
    for ids, labels in batches:
        _sync(cfg.device)
        t0 = time.perf_counter()
        x, pos = block_inputs(ids, labels, mask_id)  # (B, 2L) each
        with torch.set_grad_enabled(backward):
            out = model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=False)
            loss = mars_loss(out.logits, labels).loss
        losses.append(loss.item())
        if backward:
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            finite = finite and bool(torch.isfinite(norm)) and len(grads) > 0
            grad_norms.append(norm.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(cfg.device)
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
        "peak_gib": _peak_gib(cfg.device),
    }
    del model, opt, mask
    free()
    return result


def run_train(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    vocab = SHAPES[cfg.train_shape]["vocab_size"]
    mask_id = vocab - 1  # a spare embedding row stands in for <|mask|>
    batches = train_batches(cfg, vocab, mask_id, cfg.device)
    impls = [cfg.dense_attn]
    flex_note = None
    if cfg.flex:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401

            impls.insert(0, "flex_attention")
        except ImportError as e:
            flex_note = f"FlexAttention unavailable in torch {torch.__version__}: {e}"
    runs: dict[str, Any] = {}
    for impl in impls:
        try:
            runs[impl] = train_one(cfg, impl, batches, mask_id)
        except Exception as e:  # one path failing must not hide the other
            runs[impl] = {"attn_implementation": impl, "error": _error(e)}
        free()
        r = runs[impl]
        ok = "error" not in r and r["grads_finite"]
        what = f"train {impl}: steps run, gradients finite"
        if "error" not in r and not r["backward"]:
            what = f"train {impl}: forward runs (no backward on {cfg.device})"
        checks.append(_check(what, ok, r.get("error")))
    tol = 2e-2 if cfg.train_dtype in ("bfloat16", "float16") else 1e-4
    result: dict[str, Any] = {
        "shape": cfg.train_shape,
        "dtype": cfg.train_dtype,
        "batch": cfg.train_batch,
        "length": cfg.train_len,
        "block_size": cfg.block_size,
        "steps": cfg.train_steps,
        "runs": runs,
        "note": flex_note,
    }
    if len(runs) == 2 and all("error" not in r for r in runs.values()):
        flex, dense = runs["flex_attention"]["losses"], runs[cfg.dense_attn]["losses"]
        # Same weights and batches: step 1 must agree; later steps drift apart with the rounding of updates.
        rel = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(flex, dense, strict=True)]
        result["loss_rel_diff"] = rel
        result["loss_tolerance"] = tol
        gf, gd = runs["flex_attention"]["grad_norms"], runs[cfg.dense_attn]["grad_norms"]
        if gf and gd:
            result["grad_norm_rel_diff_step1"] = abs(gf[0] - gd[0]) / max(gd[0], 1e-12)
        kind = runs["flex_attention"]["mask"]
        checks.append(
            _check(
                f"train: FlexAttention ({kind}) loss = dense-mask loss at step 1 (rel. diff {rel[0]:.2e} ≤ {tol:g})",
                rel[0] <= tol and kind == "BlockMask",
            )
        )
    return result


# --------------------------------------------------------------------------------------------------
# 2. decode: every method on the device; lossless ones against transformers' generate
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeSpec:
    name: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    lossless: bool = False
    """Greedy and exact: must equal transformers' greedy ``generate`` (in fp32)."""
    draft: bool = False
    block: bool = False


def decode_specs(block_size: int, k: int = 5) -> list[DecodeSpec]:
    """The decode check's rows."""
    sample = {"temperature": 1.0, "top_p": 0.95}
    fused = {"block_size": block_size, "fuse": True}
    return [
        DecodeSpec("ar", "ar", lossless=True),
        DecodeSpec("prove-lossless", "prove-lossless", {"block_size": block_size}, lossless=True, block=True),
        DecodeSpec("prove-lossless fused", "prove-lossless", fused, lossless=True, block=True),
        DecodeSpec("sd", "sd", {"k": k}, lossless=True, draft=True),
        DecodeSpec("sd sampling", "sd", {"k": k, **sample}, draft=True),
        DecodeSpec("nsd sampling", "nsd", {"k": k, **sample}, draft=True),
    ]


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return [torch.randint(1, vocab - 1, (n_,), generator=gen).tolist() for n_ in lengths]


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    import torch

    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def decode_dtype(
    cfg: CheckConfig, dtype_name: str, specs: list[DecodeSpec], checks: list[dict[str, Any]]
) -> dict:
    import torch
    from prove.decode.bench.metrics import first_divergence, rate_by_depth
    from prove.decode.decoder import Decoder

    dtype = getattr(torch, dtype_name)
    vocab = SHAPES[cfg.decode_shape]["vocab_size"]
    target = random_model(
        qwen2_config(cfg.decode_shape), cfg.device, dtype, std=cfg.decode_std, seed=cfg.seed
    )
    draft = random_model(
        qwen2_config(cfg.decode_shape, layers=cfg.decode_draft_layers),
        cfg.device,
        dtype,
        std=cfg.decode_std,
        seed=cfg.seed,
    )
    n = cfg.decode_new_tokens
    lo, hi = (4, 8) if cfg.tiny else (16, 48)
    prompts = random_prompts(cfg.decode_prompts, vocab, lo, hi, cfg.seed + 1)
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
        row: dict[str, Any] = {"method": spec.method, "params": spec.params, "lossless": spec.lossless}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no prove.json: "records no trained block size"
                dec = Decoder(
                    target,
                    None,
                    method=spec.method,
                    draft=draft if spec.draft else None,
                    mask_token_id=vocab - 1 if spec.block else None,
                    device=cfg.device,
                    **spec.params,
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
            )
        except Exception as e:
            row["error"] = _error(e)
        rows[spec.name] = row
        what = f"decode {dtype_name} {spec.name}: runs on {cfg.device}"
        checks.append(_check(what, "error" not in row and row["valid"], row.get("error")))
        if spec.lossless and dtype_name == "float32" and "error" not in row:
            checks.append(
                _check(
                    f"decode float32 {spec.name} = transformers generate, token for token "
                    f"({row['agreement']:.0%} of {len(prompts)} prompts)",
                    row["agreement"] == 1.0,
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


# --------------------------------------------------------------------------------------------------
# 3. the cost curve t(w) and what it predicts
# --------------------------------------------------------------------------------------------------


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
    import torch

    dtype = torch.float32 if cfg.tiny else torch.bfloat16
    curves: dict[str, dict[int, float]] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    sizes = {s: param_bytes(qwen2_config(s), dtype) for s in set(cfg.shapes)}
    for shape in sorted(sizes, key=sizes.__getitem__):
        config = qwen2_config(shape)
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
            errors[shape] = _error(e)
        model = None  # outside the except block, whose traceback holds the frames that hold the model
        free()
        checks.append(_check(f"curve {shape}: timed", shape in curves, errors.get(shape)))
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


def interp(curve: Mapping[int, float], w: float) -> float:
    """t(w) by linear interpolation between measured widths; NaN outside them."""
    xs = sorted(curve)
    if not xs or w < xs[0] or w > xs[-1]:
        return math.nan
    for lo, hi in zip(xs, xs[1:], strict=False):
        if lo <= w <= hi:
            return curve[lo] + (curve[hi] - curve[lo]) * (w - lo) / (hi - lo)
    return curve[xs[0]]


def block_sizes_for(acceptance: Sequence[float]) -> list[int]:
    """K = 2, 4, 8, … up to the measured depth (and the measured depth itself)."""
    n = len(acceptance)
    ks = [2**i for i in range(1, 10) if 2**i <= n]
    return sorted(set(ks + ([n] if n >= 2 else [])))


def predict(
    curves: Mapping[str, Mapping[int, float]],
    acceptance: Mapping[str, Sequence[float]],
    *,
    draft: str | None,
    verifier: str | None,
    sd_k: int = 5,
    sizes: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Predicted speedup over AR (AR = one pass of width 1 per token) of each method on each target shape.

    ``a[i]`` is the share of cycles in which proposed position i (0-based) was accepted, a leading run
    (``prove-bench``'s ``acceptance_by_depth``); t = the target's t(w), t_v the verifier's, t_d the draft's.

    - prove-lossless, block K: a block pass over [c, M × (K − 1)] (width K) and a verification pass over
      [c, y_1..y_K] (width K + 1; the engine re-feeds the last committed token); commits the accepted run
      plus the correction / bonus token: tokens/cycle = 1 + Σ_{i<K} a[i], cost = t(K) + t(K + 1).
    - prove-lossless fused (all groups): one pass over [g, y_2..y_K] plus a group of K − 1 placeholders after
      each of the K acceptance lengths (width K + K(K − 1) = K²); y_1 is last cycle's correction, so
      tokens/cycle = 1 + Σ_{1≤i<K} a[i], cost = t(K²).
    - prove, block K: the block pass on the target, t(K), and the verifier's pass t_v(K + 1); commits the
      accepted run (y_1 always): tokens/cycle = Σ_{i<K} a[i].
    - sd, k: k draft passes of width 1 and the target's pass over [c, y_1..y_k]: cost = k·t_d(1) + t(k + 1),
      tokens/cycle = 1 + Σ_{i<k} a[i].

    prove and sd rows appear for targets larger than their verifier / draft (``sizes``: parameter bytes
    per shape; without it, for every other shape). Overheads outside the passes (the rule, cache crops,
    host syncs) are not in t(w): the prediction is an upper bound, tight where a pass costs much more than
    a cycle's bookkeeping (:func:`predictor_check` measures the gap).
    """
    rows: list[dict[str, Any]] = []

    def helps(helper: str | None, target: str) -> bool:
        if helper is None or helper not in curves or helper == target:
            return False
        return sizes is None or sizes.get(helper, 0) < sizes.get(target, 0)

    def add(target: str, method: str, size: str, tpc: float, cost: float, passes: str) -> None:
        speed = tpc * interp(curves[target], 1) / cost if cost and not math.isnan(cost) else math.nan
        if not math.isnan(speed):
            rows.append(
                {"target": target, "method": method, "size": size, "tokens_per_cycle": tpc,
                 "cycle_ms": cost, "passes": passes, "speedup": speed}
            )  # fmt: skip

    for target, curve in curves.items():
        a = list(acceptance.get("prove-lossless", ()))
        for k in block_sizes_for(a):
            add(target, "prove-lossless", f"K={k}", 1 + sum(a[:k]), interp(curve, k) + interp(curve, k + 1),
                f"t({k}) + t({k + 1})")  # fmt: skip
            add(
                target, "prove-lossless fused", f"K={k}", 1 + sum(a[1:k]), interp(curve, k * k), f"t({k * k})"
            )
        a = list(acceptance.get("prove", ()))
        if verifier is not None and helps(verifier, target):
            for k in block_sizes_for(a):
                add(target, "prove", f"K={k}", sum(a[:k]), interp(curve, k) + interp(curves[verifier], k + 1),
                    f"t({k}) + t_v({k + 1})")  # fmt: skip
        a = list(acceptance.get("sd", ()))
        if draft is not None and helps(draft, target) and len(a) >= sd_k:
            add(target, "sd", f"k={sd_k}", 1 + sum(a[:sd_k]), sd_k * interp(curves[draft], 1) + interp(curve, sd_k + 1),
                f"{sd_k}·t_d(1) + t({sd_k + 1})")  # fmt: skip
    return rows


def predictor_check(
    decode: Mapping[str, Any] | None, curve: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The prediction against a measurement: prove-lossless on the decode check's model (same shape and dtype as
    one cost curve), predicted from that curve and the acceptance it measured, vs its measured speedup over ar.
    The gap is what the passes do not contain: the engine's per-cycle work on the host."""
    if not decode or not curve or decode["shape"] not in curve["ms"]:
        return None
    run = decode["dtypes"].get(curve["dtype"])
    row = (run or {}).get("rows", {}).get("prove-lossless")
    if not row or "error" in row or not row.get("speedup_vs_ar"):
        return None
    acc = list(row["acceptance_by_depth"])
    t = {int(w): v for w, v in curve["ms"][decode["shape"]].items()}
    pred = [r for r in predict({"m": t}, {"prove-lossless": acc}, draft=None, verifier=None)
            if r["method"] == "prove-lossless" and r["size"] == f"K={len(acc)}"]  # fmt: skip
    if not pred:
        return None
    return {
        "shape": decode["shape"],
        "dtype": curve["dtype"],
        "block_size": len(acc),
        "tokens_per_cycle_measured": row["tokens_per_cycle"],
        "predicted": pred[0]["speedup"],
        "measured": row["speedup_vs_ar"],
    }


def load_acceptance(path: str | Path | None) -> dict[str, Any]:
    """Per-depth acceptance by method: ``gpu_check_acceptance.json``'s format, or a prove-bench bench.json
    (the first row of each method, i.e. its default parameters or the first point of a sweep)."""
    p = Path(path) if path is not None else ACCEPTANCE_DEFAULT
    if not p.is_file():
        raise ValueError(
            f"--acceptance {p}: no such file; give a prove-bench bench.json (outputs/bench/bench.json)"
        )
    data = json.loads(p.read_text())
    if "rows" in data:
        methods: dict[str, Any] = {}
        for row in data["rows"]:
            acc = row.get("acceptance_by_depth") or []
            if row["method"] in ("prove-lossless", "prove", "sd") and row["method"] not in methods and acc:
                methods[row["method"]] = {
                    "params": row.get("params") or {},
                    "acceptance_by_depth": [0.0 if v is None else v for v in acc],
                }
        data = {"source": str(p), "methods": methods}
    if not isinstance(data.get("methods"), dict) or not data["methods"]:
        raise ValueError(
            f"--acceptance {p}: no per-depth acceptance found (need a bench.json with prove-lossless / prove / sd rows)"
        )
    return data


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------


def _check(what: str, ok: bool, error: str | None = None) -> dict[str, Any]:
    return {"check": what, "ok": bool(ok), **({"error": error} if error else {})}


def _error(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    print("".join(tb), file=sys.stderr)
    return f"{type(e).__name__}: {e}"


def _f(v: Any, spec: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return format(v, spec)


def render_md(report: Mapping[str, Any]) -> str:
    env = report["env"]
    lines = [
        f"# gpu-check — {env['device_name']} ({env['device']})"
        + (" — tiny CPU smoke run" if report["tiny"] else ""),
        "",
        f"torch {env['torch']}, transformers {env['transformers']}, CUDA {report.get('cuda') or '–'}, "
        f"{env['time_utc']}, commit {(env.get('git_commit') or 'n/a')[:10]}; {report['wall_s']:.0f} s in all.",
        "",
        "## Checks",
        "",
    ]
    lines += [f"- {'✅' if c['ok'] else '❌'} {c['check']}" + (f" — `{c['error']}`" if "error" in c else "")
              for c in report["checks"]]  # fmt: skip
    train = report.get("train")
    if train:
        lines += ["", f"## 1. Training path: MARS, {train['shape']}, {train['dtype']}, batch {train['batch']} × "
                      f"{train['length']} tokens (the model reads 2 × {train['length']}), K = {train['block_size']}",
                  "", "| attention | mask | loss step 1 | loss last | tokens/s | step ms | first step ms | peak GiB |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in train["runs"].values():
            if "error" in r:
                lines.append(f"| {r['attn_implementation']} | error: {r['error']} | | | | | | |")
                continue
            lines.append(
                f"| {r['attn_implementation']} | {r['mask']} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} | "
                f"{r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | {r['first_step_ms']:.0f} | {_f(r['peak_gib'])} |"
            )
        if train.get("note"):
            lines += ["", train["note"]]
    dec = report.get("decode")
    if dec:
        lines += ["", f"## 2. Decoding on {env['device']}: random {dec['shape']} (weight std {dec['weight_std']}), "
                      f"draft = its first {dec['draft_layers']} layers, K = {dec['block_size']}, k = {dec['k']}"]  # fmt: skip
        for dt, d in dec["dtypes"].items():
            lines += ["", f"### {dt}: {d['prompts']} prompts × {d['new_tokens']} tokens "
                          f"({d['distinct_reference_tokens']} distinct tokens in the reference)", "",
                      "| method | = generate | first div. | tok/cycle | model passes/tok | accepted by depth | speedup vs ar |",
                      "|---|---:|---|---:|---:|---|---:|"]  # fmt: skip
            for name, r in d["rows"].items():
                if name == "hf-greedy":
                    continue
                if "error" in r:
                    lines.append(f"| {name} | error: {r['error']} | | | | | |")
                    continue
                agree = f"{r['agreement']:.0%}" if r["lossless"] else "(sampling)"
                acc = " ".join(_f(v) for v in r["acceptance_by_depth"]) or "–"
                divs = (
                    ",".join("–" if v is None else str(v) for v in r["first_divergence"])
                    if r["lossless"]
                    else ""
                )
                lines.append(
                    f"| {name} | {agree} | {divs} | {r['tokens_per_cycle']:.2f} | {r['model_passes_per_token']:.2f} | "
                    f"{acc} | {_f(r.get('speedup_vs_ar'))}× |"
                )
    curve = report.get("curve")
    if curve:
        widths = sorted({int(w) for c in curve["ms"].values() for w in c})
        lines += ["", f"## 3. Cost curve: ms per pass of w tokens on a warm cache of {curve['cache_len']} "
                      f"({curve['dtype']}, median of {curve['repeats']} after {curve['warmup']} warm-up)", "",
                  "| shape | " + " | ".join(f"w={w}" for w in widths) + " | t(64)/t(1) |",
                  "|---|" + "---:|" * (len(widths) + 1)]  # fmt: skip
        for shape, c in curve["ms"].items():
            ratio = c.get("64", math.nan) / c["1"] if "1" in c else math.nan
            lines.append(
                f"| {shape} | " + " | ".join(_f(c.get(str(w))) for w in widths) + f" | {_f(ratio)} |"
            )
        for shape, why in curve["skipped"].items():
            lines += ["", f"**{shape} skipped**: {why}."]
        for shape, why in curve["errors"].items():
            lines += ["", f"**{shape} failed**: `{why}`."]
    pred = report.get("prediction")
    if pred:
        lines += ["", f"## Predicted speedup over AR (from t(w) and the per-depth acceptance of {pred['source']})", "",
                  pred["note"], "", "| target | method | size | tokens/cycle | passes per cycle | cycle ms | speedup |",
                  "|---|---|---|---:|---|---:|---:|"]  # fmt: skip
        for r in pred["rows"]:
            lines.append(
                f"| {r['target']} | {r['method']} | {r['size']} | {r['tokens_per_cycle']:.2f} | {r['passes']} | "
                f"{r['cycle_ms']:.2f} | **{r['speedup']:.2f}×** |"
            )
    pc = report.get("predictor_check")
    if pc:
        lines += ["", f"Predictor check — prove-lossless K = {pc['block_size']} on the decode model ({pc['shape']}, "
                      f"{pc['dtype']}, {pc['tokens_per_cycle_measured']:.2f} tokens/cycle): predicted from t(w) "
                      f"{pc['predicted']:.2f}×, measured {pc['measured']:.2f}× over ar (the gap is the engine's "
                      "per-cycle host work, which t(w) leaves out)."]  # fmt: skip
    if report.get("plot_note"):
        lines += ["", report["plot_note"]]
    return "\n".join(lines) + "\n"


def write_plot(curve: Mapping[str, Any], out: Path) -> tuple[str | None, str | None]:
    """cost_curve.png: t(w) and t(w)/t(1) per shape; (path, None), or (None, why) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed: no cost_curve.png (the numbers are in the table above)."
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for shape, c in curve["ms"].items():
        ws = sorted(int(w) for w in c)
        ts = [c[str(w)] for w in ws]
        ax1.plot(ws, ts, marker="o", label=shape)
        ax2.plot(ws, [t / c["1"] for t in ts], marker="o", label=shape)
    for ax, ylabel in ((ax1, "ms per pass"), (ax2, "t(w) / t(1)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"w (tokens per pass, cache {curve['cache_len']})")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    fig.suptitle(f"forward-pass cost vs width ({curve['dtype']})")
    fig.tight_layout()
    path = out / "cost_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path), None


def run(cfg: CheckConfig) -> dict[str, Any]:
    """Run the parts, write gpu-check.json / .md / cost_curve.png to ``cfg.out``; returns the report."""
    import torch
    from prove.decode.bench.report import _jsonable, environment

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    acceptance = load_acceptance(cfg.acceptance)  # a bad --acceptance fails before any model is built
    checks: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "tiny": cfg.tiny,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
        "env": environment(cfg.device, "mixed"),
        "cuda": torch.version.cuda if torch.device(cfg.device).type == "cuda" else None,
        "checks": checks,
    }
    for part, fn in (("train", run_train), ("decode", run_decode), ("curve", run_curve)):
        if part not in cfg.parts:
            continue
        print(f"gpu-check: {part} …", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            report[part] = fn(cfg, checks)
        except Exception as e:
            checks.append(_check(f"{part}: ran", False, _error(e)))
        print(f"gpu-check: {part} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    curve = report.get("curve")
    if curve and curve["ms"]:
        curves = {s: {int(w): t for w, t in c.items()} for s, c in curve["ms"].items()}
        acc = {m: v["acceptance_by_depth"] for m, v in acceptance["methods"].items()}
        report["prediction"] = {
            "source": acceptance.get("source", "?"),
            "acceptance": acceptance["methods"],
            "draft": cfg.draft_shape,
            "verifier": cfg.verifier_shape,
            "note": (
                f"prove uses a {cfg.verifier_shape}-shaped verifier, sd a {cfg.draft_shape}-shaped draft at "
                f"k = {cfg.sd_k}. Fused = one pass per cycle with all K groups (width K²). The acceptance "
                "rates decide everything: pass `--acceptance bench.json` from `prove-bench` on your own model "
                "and task. Host overhead per cycle is not counted, and tokens/cycle is the steady state of long "
                "outputs (a response's EOS cuts its last cycle short): both make this an upper bound."
            ),
            "rows": predict(
                curves,
                acc,
                draft=cfg.draft_shape,
                verifier=cfg.verifier_shape,
                sd_k=cfg.sd_k,
                sizes=curve["param_bytes"],
            ),
        }
        report["predictor_check"] = predictor_check(report.get("decode"), curve)
        path, note = write_plot(curve, out)
        report["plot"] = path
        report["plot_note"] = note
    report["wall_s"] = time.perf_counter() - t0
    report["ok"] = all(c["ok"] for c in checks)
    (out / "gpu-check.json").write_text(json.dumps(_jsonable(report), indent=1, ensure_ascii=False) + "\n")
    (out / "gpu-check.md").write_text(render_md(report))
    return report


def parse_args(argv: Sequence[str] | None) -> CheckConfig:
    ap = argparse.ArgumentParser(
        prog="python -m prove.recipes.gpu_check",
        description="Prove the GPU path (bf16 MARS training with FlexAttention, CUDA decoding) and measure the "
        "pass cost curve t(w) that decides each method's speed; writes gpu-check.json/.md and cost_curve.png.",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="tiny shapes on CPU in seconds (the test suite's smoke run)"
    )
    ap.add_argument("--device", default=None, help="torch device (default cuda; cpu with --tiny)")
    ap.add_argument("--out", default="outputs/gpu-check", help="output folder (default outputs/gpu-check)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument(
        "--shapes", default=None, help=f"cost-curve shapes, comma-separated, of {', '.join(SHAPES)}"
    )
    ap.add_argument("--widths", default=None, help="cost-curve widths, e.g. 1,2,4,8,16,32,64,128,256")
    ap.add_argument(
        "--cache-len", type=int, default=None, help="warm KV cache length of the cost curve (512)"
    )
    ap.add_argument(
        "--methods", default=None, help="decode rows to run (default all), e.g. ar,prove-lossless,sd"
    )
    ap.add_argument("--acceptance", default=None, help="a prove-bench bench.json whose per-depth acceptance "
                    "the prediction uses (default: the tiny demo's, gpu_check_acceptance.json)")  # fmt: skip
    ap.add_argument("--no-flex", action="store_true", help="train with the dense mask only")
    ap.add_argument(
        "--flex", action="store_true", help="with --tiny: also run the FlexAttention path (compiles on CPU)"
    )
    args = ap.parse_args(argv)
    kw: dict[str, Any] = {"out": args.out, "parts": tuple(p for p in args.parts.split(",") if p)}
    if args.device:
        kw["device"] = args.device
    if args.shapes:
        kw["shapes"] = tuple(s for s in args.shapes.split(",") if s)
    if args.widths:
        kw["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.cache_len:
        kw["cache_len"] = args.cache_len
    if args.methods:
        kw["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.acceptance:
        kw["acceptance"] = args.acceptance
    if args.no_flex:
        kw["flex"] = False
    if args.tiny and args.flex:
        kw.update(flex=True, dense_attn="sdpa")
    return tiny_config(**kw) if args.tiny else CheckConfig(**kw)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    import torch

    if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False): "
            "run it on a machine with a GPU, or pass --tiny for the CPU smoke run",
            file=sys.stderr,
        )
        return 2
    try:
        report = run(cfg)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    print((Path(cfg.out) / "gpu-check.md").read_text())
    failed = [c["check"] for c in report["checks"] if not c["ok"]]
    print(f"gpu-check: {len(report['checks']) - len(failed)}/{len(report['checks'])} checks passed; "
          f"report in {cfg.out}/gpu-check.md", file=sys.stderr)  # fmt: skip
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
