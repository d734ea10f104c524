"""The device cycle's compiled form (``compile=true``): its regular cycle through ``torch.compile``, counted."""

from __future__ import annotations

import time
from typing import Any

import torch


class Compiled:
    """``torch.compile(step, fullgraph=True, dynamic=False)`` (inductor) for ``compile=true``. A call returns (record,
    how many graphs dynamo compiled during it): the first call of a cycle compiles, and a later one that compiles
    again (a guard that failed: shape or state drift) shows in ``FastEngine.counters['compiles']``. Every engine
    compiles ``FastEngine.step``, one code object, so dynamo's per-code-object recompile limit (8) would stop
    compiling after eight methods, widths or models in one process (gpu-check's rows): it is raised around the call."""

    RECOMPILE_LIMIT = 256

    def __init__(self, step: Any) -> None:
        self.fn = torch.compile(step, fullgraph=True, dynamic=False)
        self.last_s = 0.0

    def __call__(self, k: int) -> tuple[torch.Tensor, int]:
        import torch._dynamo as dynamo
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        limits = {
            "recompile_limit": self.RECOMPILE_LIMIT,
            "accumulated_recompile_limit": 4 * self.RECOMPILE_LIMIT,
        }
        with dynamo.config.patch(limits):
            record = self.fn(k)
        self.last_s = time.perf_counter() - t0
        return record, counters["stats"]["unique_graphs"] - before
