"""CPU threads per process when DeepSpeed runs the optimizer on the CPU (ZeRO-Offload).

With ``offload_optimizer`` the fp32 master weights and Adam moments live in host memory and every optimizer step
runs on the CPU: DeepSpeed's CPU Adam parallelises over OpenMP threads, torch's AdamW over its intra-op threads.
The step streams ~30 bytes a parameter through memory, so one thread per process leaves most of the node's
memory bandwidth idle — and one is what a launch gets: torchrun sets ``OMP_NUM_THREADS=1`` when it is unset, and
the Makefile exports ``OMP_NUM_THREADS ?= 1`` (right for the tiny models, which are framework-overhead bound).
``cpu_threads`` (default: sized here) sets each process's count itself, at the start of the stage, before
DeepSpeed builds its optimizer::

    threads = max(1, physical cores of the node // processes on the node)   # 8 ranks on 2 × 48 cores: 12 each
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


def offloads_optimizer(ds: dict[str, Any] | None) -> bool:
    """Whether a DeepSpeed config runs the optimizer step on the CPU (``offload_optimizer.device`` cpu or nvme)."""
    zero = (ds or {}).get("zero_optimization") or {}
    return ((zero.get("offload_optimizer") or {}).get("device") or "none") in ("cpu", "nvme")


def node_cores() -> int:
    """Cores this process may run on: the physical cores when psutil tells them (hyper-threads add little to a
    memory-bound step), never more than the affinity mask allows."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    return max(1, min(usable, physical or usable))


def rank_threads(cores: int, local_processes: int) -> int:
    """Threads for each of ``local_processes`` processes sharing ``cores``: an even share, at least one."""
    if local_processes < 1:
        raise ValueError(f"local_processes={local_processes}: a node runs at least one process")
    return max(1, cores // local_processes)


def cpu_threads(cfg: Any, environ: dict[str, str] | None = None, cores: int | None = None) -> int | None:
    """This process's thread count for ``cfg``: ``cfg.cpu_threads`` when ≥ 1; sized from the node's cores when it is
    0, or ``None`` with the optimizer offloaded; ``None`` (leave the environment's) otherwise."""
    if cfg.cpu_threads:
        return int(cfg.cpu_threads)
    if cfg.cpu_threads is None and not offloads_optimizer(cfg.deepspeed):
        return None
    env = os.environ if environ is None else environ
    local = int(env.get("LOCAL_WORLD_SIZE", "1"))  # set by torchrun and DeepSpeed's launcher
    return rank_threads(node_cores() if cores is None else cores, local)


def set_cpu_threads(cfg: Any) -> int | None:
    """Apply :func:`cpu_threads`: ``torch.set_num_threads`` (torch's pool and this thread's OpenMP count) and
    ``OMP_NUM_THREADS`` (read by an OpenMP runtime loaded later, e.g. the CPU Adam extension's). Returns the count
    set, or ``None`` when left alone."""
    n = cpu_threads(cfg)
    if n is None:
        return None
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    log.info("CPU threads per process: %d (cpu_threads=%s)", n, cfg.cpu_threads)
    return n


def require_cpu_adam(ds: dict[str, Any] | None, load: Any = None) -> None:
    """With the optimizer offloaded to DeepSpeed's CPU Adam (``torch_adam`` false): build it now (a JIT C++ build with
    ninja, once, cached in ``~/.cache/torch_extensions``; ``load`` stands in for ``CPUAdamBuilder().load`` in tests),
    so a node that cannot build it is refused in one line at start — not with a compiler's traceback once the model
    is sharded. Nothing happens for torch's AdamW or an optimizer that stays on the GPU."""
    if not offloads_optimizer(ds):
        return
    params = ((ds or {}).get("optimizer") or {}).get("params") or {}
    if params.get("torch_adam"):
        return
    try:
        if load is None:
            from deepspeed.ops.op_builder import CPUAdamBuilder

            load = CPUAdamBuilder().load
        load()
    except (
        Exception
    ) as e:  # ImportError, a compiler's CalledProcessError, RuntimeError from torch's cpp_extension
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(
            f"the DeepSpeed config offloads the optimizer to DeepSpeed's CPU Adam, which does not build here "
            f"({type(e).__name__}: {first[:200]}): install a C++ compiler and ninja (the build needs torch's headers), "
            "or set deepspeed.optimizer.params.torch_adam=true to step with torch's AdamW on the CPU (slower)"
        ) from e
