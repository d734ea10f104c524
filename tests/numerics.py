"""How near two fp32 computations of one quantity must lie, and what is compared exactly.

Notation
    u        fp32 unit roundoff, 2⁻²⁴ (``torch.finfo(torch.float32).eps / 2``)
    n        the longest reduction of the computation: the longest dot product a GEMM or an attention row sums
             (a tiny test model's intermediate size, or its context if that is longer)
    d        its depth: how many such reductions lie one after another on the way to the compared value
             (two per layer — attention and MLP — and the head)
    s        the compared values' scale, max |want| (at least 1)

Two passes that compute the same function with other kernels — another GEMM shape (a padded or a narrower width),
a fused tree against a chain, a compiled graph against eager, the slot cache against ``DynamicCache``, or another
SIMD path of ATen and MKL (``ATEN_CPU_CAPABILITY=default|avx2|avx512``, ``MKL_ENABLE_INSTRUCTIONS``) on another
CPU — add the same products in another order. One dot product of length n then differs by at most
2·γₙ·Σ|aᵢbᵢ| with γₙ = n·u/(1 − n·u) (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1), and the
difference passes through the d reductions after it. ``fp32_tol`` is that bound with Σ|aᵢbᵢ| taken as the
compared values' scale: ``d · 2nu · s``. It is a bound, not a typical gap (orders cancel, so typical gaps are
√n-sized), and it stays far below any real mistake: a mask one slot too wide, a stale slot read or an off-by-one
position moves a random tiny model's logits by 10⁻² to 1, against ~10⁻⁴ here.

What the product relies on is compared exactly: the committed tokens, and each row's argmax wherever the
reference's top two lie further apart than the tolerance (a pair nearer than that is a tie that another summation
order may break either way; the greedy decode tests choose prompts and seeds whose margins are wide).

Computations that run the same kernels on the same shapes (a checkpoint saved and reloaded, a step recomputed
with the same batch) are compared exactly or at a few ulps, and say so where they do.
"""

from __future__ import annotations

import pytest
import torch

U = torch.finfo(torch.float32).eps / 2  # 2**-24


def fp32_tol(want: torch.Tensor | float, *, reduction: int, depth: int) -> float:
    """The absolute tolerance ``depth · 2·reduction·u · max(1, max|want|)`` (module docstring)."""
    scale = float(want.detach().abs().max()) if isinstance(want, torch.Tensor) else abs(float(want))
    return depth * 2 * reduction * U * max(1.0, scale)


def model_reduction(model) -> tuple[int, int]:
    """``(n, d)`` of a transformers decoder: its longest weight reduction and two reductions a layer plus the head."""
    cfg = model.config
    n = max(cfg.hidden_size, getattr(cfg, "intermediate_size", 0) or 0)
    return n, 2 * cfg.num_hidden_layers + 1


def assert_same_function(
    got: torch.Tensor, want: torch.Tensor, *, reduction: int, depth: int, argmax: bool = True, msg: str = ""
) -> None:
    """``got`` and ``want`` computed by two kernels from the same inputs: values within ``fp32_tol``; with
    ``argmax`` (logits) the argmax of each row equal wherever ``want``'s top two lie more than twice the tolerance
    apart (the values' bound implies it; it is checked so that the test states what decoding relies on)."""
    tol = fp32_tol(want, reduction=reduction, depth=depth)
    torch.testing.assert_close(
        got, want, rtol=0, atol=tol, msg=lambda m: f"{msg} (fp32 bound {tol:.2e})\n{m}"
    )
    if argmax and want.dim() and want.shape[-1] > 1:
        top = want.float().topk(2, dim=-1).values
        decided = (top[..., 0] - top[..., 1]) > 2 * tol
        same = got.argmax(-1) == want.argmax(-1)
        assert bool(same[decided].all()), (
            f"{msg}: argmax differs where the reference's margin exceeds {2 * tol:.2e}"
        )


def assert_logits_match(
    got: torch.Tensor, want: torch.Tensor, model, *, context: int = 0, msg: str = ""
) -> None:
    """``assert_same_function`` with ``model``'s reduction length and depth; ``context``: the longest attention row
    (the number of cached plus fed tokens) where it exceeds the weights' reductions."""
    n, d = model_reduction(model)
    assert_same_function(got, want, reduction=max(n, context), depth=d, msg=msg)


def assert_caches_match(
    got_layers, want_layers, model, *, context: int = 0, slots: int | None = None
) -> None:
    """Two KV caches of ``model`` over the same tokens, layer by layer (``.keys`` / ``.values``; the caches'
    capacity may differ: the first ``want``'s length of slots is compared, or the first ``slots`` where two slot
    caches hold stale entries past them)."""
    n, d = model_reduction(model)
    for i, (mine, ref) in enumerate(zip(got_layers, want_layers, strict=True)):
        for name in ("keys", "values"):
            want = getattr(ref, name)[..., :slots, :]
            got = getattr(mine, name)[..., : want.shape[-2], :]
            assert_same_function(
                got, want, reduction=max(n, context), depth=d, argmax=False, msg=f"layer {i} {name}"
            )


def assert_losses_match(
    got: torch.Tensor | float,
    want: torch.Tensor | float,
    model,
    *,
    context: int = 0,
    logit_scale: float = 1.0,
) -> None:
    """Two computations of a cross-entropy (a mean of ``logsumexp(z) − z_y`` over rows): each row moves by at most
    twice its logits' bound, so the mean does too. ``logit_scale``: max |logits| where the test has them."""
    n, d = model_reduction(model)
    tol = 2 * fp32_tol(logit_scale, reduction=max(n, context), depth=d)
    got, want = float(got), float(want)
    assert abs(got - want) <= tol, (
        f"loss {got} against {want}: |Δ| {abs(got - want):.2e} over the fp32 bound {tol:.2e}"
    )


def assert_grads_match(got: dict, want: dict, model, *, tokens: int) -> None:
    """Gradients of one loss computed two ways, by parameter name. The backward pass runs the forward's reductions
    again in reverse (depth 2d) and a weight's gradient sums over every token of the batch (reduction ≥ ``tokens``)."""
    assert sorted(got) == sorted(want) and len(want) > 0
    n, d = model_reduction(model)
    for name, g in want.items():
        assert_same_function(got[name], g, reduction=max(n, tokens), depth=2 * d, argmax=False, msg=name)


def logit_scale(model, input_ids: torch.Tensor) -> float:
    """max |logits| of ``model`` on ``input_ids``: the scale a loss comparison's bound takes."""
    with torch.no_grad():
        return float(model(input_ids=input_ids).logits.abs().max())


needs_vector_isa = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="inductor's CPU FlexAttention template needs a vectorized ISA (AVX2 or AVX-512); ATen runs DEFAULT",
)
"""For the FlexAttention tests on the CPU: under ``ATEN_CPU_CAPABILITY=default`` inductor refuses to lower
``flex_attention`` ("torch.compile on current platform is not supported for CPU"). FlexAttention is the GPU path."""
