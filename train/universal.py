"""Resuming a DeepSpeed checkpoint on another number of processes, through DeepSpeed's universal checkpoints.

A ZeRO checkpoint (``checkpoint-N/global_stepN/*_optim_states.pt``, one file a process) holds each process's
slice of the optimizer state; DeepSpeed refuses to load it into another number of processes. Its own tool
rewrites it per parameter, independent of the partitioning::

    python -m deepspeed.checkpoint.ds_to_universal --input_folder checkpoint-N/global_stepN \\
        --output_folder checkpoint-N/global_stepN_universal      # also writes checkpoint-N/latest_universal

after which an engine with ``{"checkpoint": {"load_universal": true}}`` loads it at any world size. A relaunch on a
different number of processes does both: the first process converts the newest checkpoint (once — the universal
copy stays beside the original, so a second relaunch reuses it) while the others wait on its ``latest_universal``
file (not in a collective: converting 0.5 TB outlasts any barrier's timeout; a conversion that fails leaves
``universal_failed`` beside it, which they raise on), then the stage resumes from it with ``load_universal`` set.
The Trainer's own state (step, schedule, log history) is world-size independent; the micro-batch × accumulation
split may change with it (keep their product × processes, the effective batch).

DeepSpeed reads ``load_universal`` from the engine's config on every ``load_checkpoint``, so once the resume has
loaded it is cleared again (:class:`UniversalResumeCallback`): the checkpoints the resumed run writes are ordinary
ones, and ``eval.best``'s load at the end (:func:`loading`) sets it only for a best checkpoint that the old number
of processes wrote (converted first when the resume did not).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from transformers import TrainerCallback

log = logging.getLogger(__name__)

LATEST_UNIVERSAL = "latest_universal"
FAILED = "universal_failed"
"""Rank 0 writes it into the checkpoint when ds_to_universal fails (its error inside); the waiting ranks raise
on it."""
_RANK_FILE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def zero_step_dir(checkpoint: str | Path) -> Path | None:
    """The ``global_stepN`` folder of DeepSpeed's state inside a Trainer ``checkpoint-N`` (None: not a DeepSpeed one)."""
    tag_file = Path(checkpoint) / "latest"
    if tag_file.is_file():
        step = Path(checkpoint) / tag_file.read_text().strip()
        if step.is_dir():
            return step
    step_dir = re.compile(r"^global_step(\d+)$")
    steps = sorted(
        (int(m.group(1)), p)
        for p in Path(checkpoint).glob("global_step*")
        if p.is_dir() and (m := step_dir.match(p.name))
    )
    return steps[-1][1] if steps else None  # by number: global_step999 comes before global_step1000


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
    """Run :func:`convert_command` (a half-written earlier attempt is removed first); returns the universal folder.
    On failure it leaves :data:`FAILED` (the error) in ``checkpoint`` for the ranks waiting on it, and raises."""
    cmd = convert_command(checkpoint)
    out = Path(cmd[cmd.index("--output_folder") + 1])
    failed = Path(checkpoint) / FAILED
    failed.unlink(missing_ok=True)  # an earlier launch's
    if out.exists():  # no latest_universal: an attempt that died part-way
        shutil.rmtree(out)
    log.info("converting %s to a universal checkpoint: %s", checkpoint, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        msg = (
            f"ds_to_universal failed on {checkpoint} (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-4000:]}\nrun it by hand: {' '.join(cmd)}"
        )
        failed.write_text(msg)
        raise RuntimeError(msg)
    found = universal_dir(checkpoint)
    assert found is not None, f"ds_to_universal wrote no {LATEST_UNIVERSAL} in {checkpoint}"
    return found


def wait_for(
    path: Path, what: str, poll_s: float = 2.0, say_every_s: float = 300.0, failed: Path | None = None
) -> None:
    """Wait until ``path`` exists (another process is writing it), saying so every ``say_every_s``; raise when
    ``failed`` appears first (the writer's failure marker) — one older than this process is an earlier launch's."""
    start = last = time.monotonic()
    born = psutil.Process().create_time()
    while not path.exists():
        if failed is not None and failed.is_file() and failed.stat().st_mtime >= born:
            raise RuntimeError(f"the process writing {path} failed ({what}):\n{failed.read_text()[-3000:]}")
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
    log.info("%s was written by %d processes, this run has %d: resuming through a universal checkpoint",
             checkpoint, saved, world_size)  # fmt: skip
    ensure_universal(checkpoint, rank)
    return {**deepspeed, "checkpoint": {**(deepspeed.get("checkpoint") or {}), "load_universal": True}}


def ensure_universal(checkpoint: str | Path, rank: int) -> None:
    """Make the universal copy of ``checkpoint`` unless it exists: rank 0 converts, the other ranks wait for it
    (and raise when rank 0's conversion failed)."""
    if universal_dir(checkpoint) is not None:
        return
    if rank == 0:
        convert(checkpoint)
    else:
        wait_for(
            Path(checkpoint) / LATEST_UNIVERSAL,
            "rank 0 converts it with ds_to_universal",
            failed=Path(checkpoint) / FAILED,
        )


def set_load_universal(engine: Any, on: bool) -> None:
    """Whether the DeepSpeed ``engine``'s next ``load_checkpoint`` reads a universal checkpoint.

    DeepSpeed (checked on 0.19.8) reads it from the engine's parsed config
    (``engine._config.load_universal_checkpoint``) on every load and offers no setter: this is the one place that
    writes it."""
    config = getattr(engine, "_config", None)
    if config is None or not hasattr(config, "load_universal_checkpoint"):
        raise RuntimeError(
            f"this DeepSpeed ({type(engine).__module__}) keeps load_universal_checkpoint elsewhere: "
            "prove.train.universal.set_load_universal needs updating for it"
        )
    config.load_universal_checkpoint = on


class UniversalResumeCallback(TrainerCallback):
    """Clears ``load_universal`` once a world-size resume has loaded (``on_train_begin`` runs right after the
    Trainer's resume load): from there on the run is an ordinary one, its own checkpoints ordinary ones."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        set_load_universal(self.trainer.model_wrapped, False)


@contextmanager
def loading(engine: Any, checkpoint: str | Path, world_size: int, rank: int) -> Iterator[None]:
    """Around a ``load_checkpoint`` of ``checkpoint`` into ``engine`` (None: no DeepSpeed, nothing to do): when
    another number of processes wrote it, convert it (once) and load it as a universal checkpoint."""
    saved = saved_world_size(checkpoint) if engine is not None else None
    if saved is None or saved == world_size:
        yield
        return
    log.info("%s was written by %d processes, this run has %d: loading it as a universal checkpoint",
             checkpoint, saved, world_size)  # fmt: skip
    ensure_universal(checkpoint, rank)
    set_load_universal(engine, True)
    try:
        yield
    finally:
        set_load_universal(engine, False)
