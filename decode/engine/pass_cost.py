"""What one pass costs this device by its width: timed once per Decoder, read by the choices a width drives.

Two readers: ``fuse_groups=auto`` prices a wider fused pass on the curve (``CostCurve``,
``prove.decode.engine.fused.choose_groups_by_cost``), and ``pad_widths=auto`` pads a linear pass to a cheaper wider
one (``prove.decode.engine.padding``); ``prove-bench pass_cost_widths=`` reports the same timings. The measurement
is the device's, not one method's: it lives apart from its readers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from prove.decode.engine import ModelRunner, device_sync
from prove.decode.engine.tree import tree_layout


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one pass by the number of tokens it feeds, from passes timed at a few widths
    (``measure_pass_cost``): the least-squares line through the widths ≥ 2 (never sloping down, never under a
    one-token pass). A line, not the points joined up: a decision about 7 more entries reads the curve's slope,
    and between neighbouring points timing noise is as large as the slope itself (four calibrations in a row on the
    demo's CPU read the step from 20 to 25 tokens as 0% to 6% of a pass)."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.widths) < 2 or list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 1:
            raise ValueError(f"a cost curve needs ≥ 2 increasing widths ≥ 1, got {self.widths}")
        if len(self.seconds) != len(self.widths) or min(self.seconds) <= 0:
            raise ValueError("a cost curve needs one positive time per width")

    @functools.cached_property
    def line(self) -> tuple[float, float]:
        """(intercept, slope ≥ 0) of the fit."""
        pts = [(w, t) for w, t in zip(self.widths, self.seconds, strict=True) if w >= 2]
        if len(pts) < 2:
            pts = list(zip(self.widths, self.seconds, strict=True))
        mw = sum(w for w, _ in pts) / len(pts)
        mt = sum(t for _, t in pts) / len(pts)
        var = sum((w - mw) ** 2 for w, _ in pts)
        slope = max(0.0, sum((w - mw) * (t - mt) for w, t in pts) / var)
        return mt - slope * mw, slope

    def __call__(self, w: float) -> float:
        a, b = self.line
        return max(self.seconds[0], a + b * w)


COST_CONTEXT = 128
"""Cached tokens under ``fuse_groups=auto``'s timed passes (attention over the context is a small part of a pass)."""


def widest_tree(block_size: int) -> int:
    """The width of the widest fused pass for block size K: a carried proposal of k ≤ K − 1 tokens, a second
    candidate's k − b ≤ K − 1 entries and its group of ≤ K − 1, a group of ≤ K − 1 placeholders for each of
    the k + 1 acceptance lengths, and two pending tokens: (K + 3)(K − 1) + 2, 79 at K = 8 and 287 at K = 16.
    (More tokens are pending only after an accepted second candidate; ``CostCurve`` extrapolates its line.)"""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be ≥ 1")
    return (block_size + 3) * max(block_size - 1, 1) + 2


def cost_widths(block_size: int) -> list[int]:
    """Where ``fuse_groups=auto`` measures the pass cost: 1, 2, 4, then steps of a quarter of the width so far,
    up to the widest fused tree for this K (``widest_tree``)."""
    top = widest_tree(block_size)
    ws = [1, 2, 4]
    while ws[-1] < top:
        ws.append(min(top, ws[-1] + max(4, ws[-1] // 4)))
    return ws


@torch.no_grad()
def measure_pass_cost(
    model: Any,
    widths: Sequence[int],
    *,
    context: Sequence[int],
    repeats: int = 4,
    plain_step: bool = False,
    linear: bool = False,
) -> list[float]:
    """Wall seconds of one pass feeding w tokens (w in ``widths``) after ``context`` cached tokens: the last
    context token plus a causal chain of w − 1, through ``ModelRunner.forward_tree`` (the fused pass's masked
    path). ``repeats`` rounds over the widths, narrow to wide then wide to narrow in turn (a machine slowing down
    or speeding up during the calibration then tilts no width's best time more than another's), the fastest
    counts; the model's own cache is not touched (a runner of its own).

    ``plain_step``: also time AR's own step (``ModelRunner.forward``, one token, no mask) in every round, on the
    same runner and right after the round's first pass, and append its fastest as one more entry: timed apart
    from the masked passes (after them, or on another runner), the two read 1.4× and 1.6× apart in two demo
    benches on a noisy CPU.

    ``linear``: time the plain causal pass instead (``ModelRunner.forward``, no mask: what an unfused cycle runs),
    for ``prove.decode.engine.padding``."""
    if not context:
        raise ValueError("measure_pass_cost needs a context of at least one token")
    runner = ModelRunner(model)
    seq = list(context)
    runner.forward(seq)  # cache the context; every timed pass re-feeds only its last token
    # the chain's tokens: the context's, repeated as far as the widest pass needs (a pass may be wider than the
    # context: the fused tree at K = 16 is 287 entries)
    tokens = [seq[i % len(seq)] for i in range(max(widths, default=1))]

    def timed(w: int | None) -> float:
        """One pass: the masked chain of width w, or AR's plain step (None)."""
        runner._rows = None  # every timed pass feeds its full width (no reused row)
        if w is None:
            step = functools.partial(runner.forward, seq)
        elif linear:
            step = functools.partial(runner.forward, seq, tokens[: w - 1])
        else:
            chain = tree_layout(w - 1, [])  # a causal chain: the y's of a tree without groups
            step = functools.partial(
                runner.forward_tree,
                seq,
                tokens[: w - 1],
                offsets=chain.offsets,
                attend=chain.attend,
                chain=w - 1,
            )
        device_sync(runner.device)
        t0 = time.perf_counter()
        step()
        device_sync(runner.device)
        return time.perf_counter() - t0

    return _fastest_by_width(timed, widths, repeats, plain_step)


def _fastest_by_width(
    timed: Callable[[int | None], float], widths: Sequence[int], repeats: int, plain_step: bool
) -> list[float]:
    """Each width's fastest of ``repeats`` rounds, narrow to wide then wide to narrow in turn; ``plain_step``: AR's
    step (``timed(None)``) right after each round's first pass, its fastest appended."""
    best = [float("inf")] * (len(widths) + plain_step)
    order = list(range(len(widths)))
    for r in range(repeats):
        for n, i in enumerate(order if r % 2 == 0 else order[::-1]):
            best[i] = min(best[i], timed(widths[i]))
            if plain_step and n == 0:
                best[-1] = min(best[-1], timed(None))
    return best
