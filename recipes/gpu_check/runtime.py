"""What the three parts share: timing a call, peak memory, freeing the device, and the report's check entries."""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


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


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """Peak CUDA memory allocated since :func:`peak_reset`, in GiB; None off CUDA."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def check_entry(what: str, ok: bool, error: str | None = None) -> dict[str, Any]:
    """One line of the report's checks: what was checked, whether it held, and the error if it raised."""
    return {"check": what, "ok": bool(ok), **({"error": error} if error else {})}


def describe_error(e: BaseException) -> str:
    """The traceback to stderr (the run goes on with the other checks); one line for the report."""
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    print("".join(tb), file=sys.stderr)
    return f"{type(e).__name__}: {e}"
