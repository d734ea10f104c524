"""Resuming a DeepSpeed checkpoint on another number of processes, through DeepSpeed's universal checkpoints.

A ZeRO checkpoint (``checkpoint-N/global_stepN/*_optim_states.pt``, one file a process) holds each process's
slice of the optimizer state; DeepSpeed refuses to load it into another number of processes. Its own tool
rewrites it per parameter, independent of the partitioning::

    python -m deepspeed.checkpoint.ds_to_universal --input_folder checkpoint-N/global_stepN \\
        --output_folder checkpoint-N/global_stepN_universal      # also writes checkpoint-N/latest_universal

after which an engine with ``{"checkpoint": {"load_universal": true}}`` loads it at any world size. A relaunch on a
different number of processes does both: the first process converts the newest checkpoint (once — the universal
copy stays beside the original, so a second relaunch reuses it) while the others wait on its ``latest_universal``
file (not in a collective: converting 0.5 TB outlasts any barrier's timeout), then the stage resumes from it with
``load_universal`` set. The Trainer's own state (step, schedule, log history) is world-size independent; the
micro-batch × accumulation split may change with it (keep their product × processes, the effective batch).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LATEST_UNIVERSAL = "latest_universal"
_RANK_FILE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def zero_step_dir(checkpoint: str | Path) -> Path | None:
    """The ``global_stepN`` folder of DeepSpeed's state inside a Trainer ``checkpoint-N`` (None: not a DeepSpeed one)."""
    tag_file = Path(checkpoint) / "latest"
    if tag_file.is_file():
        step = Path(checkpoint) / tag_file.read_text().strip()
        if step.is_dir():
            return step
    steps = sorted(
        p for p in Path(checkpoint).glob("global_step*") if p.is_dir() and not p.name.endswith("_universal")
    )
    return steps[-1] if steps else None


def saved_world_size(checkpoint: str | Path) -> int | None:
    """How many processes wrote the checkpoint's ZeRO state (its optimizer files; None: no ZeRO state)."""
    step = zero_step_dir(checkpoint)
    if step is None:
        return None
    ranks = {int(m.group(1)) for f in step.iterdir() if (m := _RANK_FILE.search(f.name))}
    return len(ranks) or None


def universal_dir(checkpoint: str | Path) -> Path | None:
    """The finished universal copy beside the checkpoint's ZeRO state (its ``latest_universal`` names it)."""
    latest = Path(checkpoint) / LATEST_UNIVERSAL
    if not latest.is_file():
        return None
    out = Path(checkpoint) / latest.read_text().strip()
    return out if out.is_dir() else None


def convert_command(checkpoint: str | Path) -> list[str]:
    """The one command that converts ``checkpoint``'s ZeRO state to a universal checkpoint beside it."""
    step = zero_step_dir(checkpoint)
    assert step is not None, f"{checkpoint} holds no DeepSpeed state"
    out = step.parent / f"{step.name}_universal"
    # DeepSpeed's default workers (4 processes extract the ZeRO shards, 2 merge them), fewer on a small machine
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    extract, merge = max(1, min(4, cores // 2)), max(1, min(2, cores // 4))
    return [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(step),
            "--output_folder", str(out), "--num_extract_workers", str(extract),
            "--num_merge_workers", str(merge)]  # fmt: skip


def convert(checkpoint: str | Path) -> Path:
    """Run :func:`convert_command` (a half-written earlier attempt is removed first); returns the universal folder."""
    cmd = convert_command(checkpoint)
    out = Path(cmd[cmd.index("--output_folder") + 1])
    if out.exists():  # no latest_universal: an attempt that died part-way
        shutil.rmtree(out)
    log.info("converting %s to a universal checkpoint: %s", checkpoint, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"ds_to_universal failed on {checkpoint} (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-4000:]}\nrun it by hand: {' '.join(cmd)}"
        )
    found = universal_dir(checkpoint)
    assert found is not None, f"ds_to_universal wrote no {LATEST_UNIVERSAL} in {checkpoint}"
    return found


def wait_for(path: Path, what: str, poll_s: float = 2.0, say_every_s: float = 300.0) -> None:
    """Wait until ``path`` exists (another process is writing it), saying so every ``say_every_s``."""
    start = last = time.monotonic()
    while not path.exists():
        time.sleep(poll_s)
        if time.monotonic() - last > say_every_s:
            last = time.monotonic()
            log.info("still waiting for %s (%s, %.0f min)", path, what, (last - start) / 60)


def prepare_resume(
    checkpoint: str | None, deepspeed: dict[str, Any] | None, world_size: int, rank: int
) -> dict[str, Any] | None:
    """The DeepSpeed config to resume ``checkpoint`` with at ``world_size`` processes: unchanged when it was
    written by as many (or is no ZeRO checkpoint), else with ``load_universal`` set once the universal copy
    exists — rank 0 converts it, the other ranks wait for it."""
    if checkpoint is None or deepspeed is None:
        return deepspeed
    saved = saved_world_size(checkpoint)
    if saved is None or saved == world_size:
        return deepspeed
    if universal_dir(checkpoint) is None:
        log.info("%s was written by %d processes, this run has %d: resuming through a universal checkpoint",
                 checkpoint, saved, world_size)  # fmt: skip
        if rank == 0:
            convert(checkpoint)
        else:
            wait_for(Path(checkpoint) / LATEST_UNIVERSAL, "rank 0 converts it with ds_to_universal")
    return {**deepspeed, "checkpoint": {**(deepspeed.get("checkpoint") or {}), "load_universal": True}}
