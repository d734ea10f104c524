"""Padded passes (``pad_widths=auto``): a linear pass runs wider where a wider pass costs this device less.

A pass's cost is not monotone in its width everywhere. On a CPU the BLAS picks its kernels by the shape of the
matrix product, so some widths run slower than wider ones: SmolLM2-135M on the 2-core CI machine took 135 ms to
feed 7 tokens and 100 ms to feed 8 (docs/benchmarks.md). GPU stacks pad for the same reason: vLLM replays the
CUDA graph of the next captured batch size, and our device cycle has fixed widths of its own.

``pad_plan`` is the pure part: from a pass-cost curve measured at consecutive widths, each width w whose pass costs
more than a wider one's maps to the cheapest wider width w' (by at least ``PAD_MARGIN``, so timing noise pads
nothing). ``ModelRunner`` then feeds w' − w filler tokens after the w real ones (a causal pass: no real row sees
them), keeps the real rows' logits and crops the filler's cache entries at once, so every later pass sees exactly
the cache an unpadded one leaves. Tree passes (the fused verify-and-draft pass) are sized by ``fuse_groups=auto``
and are never padded.

The Decoder measures the curve once per model (``plan_for``; a few dozen passes) when ``pad_widths=auto`` on the
composed cycle. Outputs are the same as unpadded up to floating-point rounding (a wider matrix product may round
differently, as any batched verification does against AR's one-token passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prove.decode.engine.memo import IdentityMemo

PAD_MARGIN = 0.05
"""A wider pass is taken only when it costs at least this share less than the narrower one."""

PAD_CONTEXT = 128
"""Cached tokens under the timed passes (the same as ``fuse_groups=auto``'s calibration)."""

_PLANS: IdentityMemo[PadPlan] = IdentityMemo(16)


def pad_plan(
    widths: Sequence[int], seconds: Sequence[float], *, margin: float = PAD_MARGIN
) -> dict[int, int]:
    """{w: w'} for each measured width w whose pass costs more than (1 − ``margin``) × the cheapest measured pass
    wider than it, w' being that cheapest one (the narrowest among equals). Widths with no cheaper wider pass are
    left out (they run as they are)."""
    if len(widths) != len(seconds):
        raise ValueError("pad_plan needs one time per width")
    if list(widths) != sorted(set(widths)) or (widths and widths[0] < 1):
        raise ValueError(f"pad_plan needs increasing widths ≥ 1, got {list(widths)}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin} must lie in [0, 1)")
    plan: dict[int, int] = {}
    best_w, best_t = None, float("inf")
    # widest first: (best_w, best_t) is the cheapest pass wider than w
    for w, t in reversed(list(zip(widths, seconds, strict=True))):
        if best_w is not None and best_t <= (1 - margin) * t:
            plan[int(w)] = int(best_w)
        if t <= best_t:
            best_w, best_t = w, t
    return dict(sorted(plan.items()))


def pad_widths_needed(block_size: int | None, k: int | None) -> list[int]:
    """The widths ``plan_for`` measures: 1 up to twice the longest proposal plus two (``prove``'s block pass
    re-feeds up to K accepted tokens beside its K placeholders; a verification reads K + 1), at least 1..8."""
    longest = max(int(block_size or 0), int(k or 0), 1)
    return list(range(1, max(2 * longest + 2, 8) + 1))


@dataclass(frozen=True)
class PadPlan:
    """A model's measured linear-pass cost (seconds by width) and the plan made from it, {w: w'}."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]
    pad_to: dict[int, int]

    def record(self) -> dict[str, Any]:
        """JSON-ready: what ``prove-bench`` stores beside a row (ms by width, and the plan)."""
        return {
            "widths": list(self.widths),
            "ms": [round(1000 * t, 3) for t in self.seconds],
            "pad_to": {str(w): v for w, v in self.pad_to.items()},
        }


def plan_for(model: Any, widths: Sequence[int], *, repeats: int = 4) -> PadPlan:
    """``pad_plan`` of ``model``'s linear passes on this device at ``widths``, measured once per model object and
    width set (``pass_cost.measure_pass_cost`` with ``linear=True``)."""
    from prove.decode.engine.pass_cost import measure_pass_cost

    def build() -> PadPlan:
        vocab = model.get_output_embeddings().weight.shape[0]
        context = [i % vocab for i in range(PAD_CONTEXT)]
        seconds = measure_pass_cost(model, widths, context=context, repeats=repeats, linear=True)
        return PadPlan(tuple(widths), tuple(seconds), pad_plan(widths, seconds))

    return _PLANS.get((model,), (tuple(widths), repeats), build)
