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
