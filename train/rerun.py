"""What a (re)launch of a stage does with what its output folder already holds — the one rule behind rerunning
``make train-proposer`` after a crash, ``resume``, ``force`` and the demo's rerun.

The stage's output folder holds at most a finished checkpoint (its ``prove.json``, written last) and the
``checkpoint-N/`` folders of the training that produced it (or is producing it):

- a finished ``prove.json`` of **the same config** (:func:`config_differences` is empty): the stage is skipped
  with a line saying so; ``force=true`` trains it again from its first step;
- a finished ``prove.json`` of another config (another learning rate, more steps...): the stage trains from its
  first step — its checkpoints belong to the other config — unless ``resume=true`` continues from the newest;
- no ``prove.json`` (a half-finished stage), or one whose wall-time cap stopped it before its last step
  (``stopped_early``): it resumes from its newest ``checkpoint-N`` as ``resume`` says — ``None`` if there is one,
  ``true`` there must be one, ``false`` start over.

A resume continues the run its checkpoints belong to. Each launch that trains records its config and process count
in :data:`START_RECORD` when it starts (``prove.json`` comes only at the end); a resume whose config differs from
that record (or, without one, from a capped ``prove.json``'s) is refused with a line naming the keys and the fixes:
``force=true`` trains from the first step, ``resume=true`` continues with the new config on purpose. Raising
``max_steps`` is allowed (that is how a capped run is extended). Another effective batch is refused even with
``resume=true`` — the Trainer would skip the wrong rows — and the line names the accumulation that keeps it.

"The same config" compares the whole resolved config recorded in ``prove.json`` (``training_config``) with this
run's — every key the record holds (a key it lacks came with a newer prove and is named in the skip line) —
leaving out what does not change the trained model (:data:`IGNORED`): where outputs and logs go, how
often the trainer logs and saves, the relaunch knobs themselves, and how the work is laid out on the machines —
the DeepSpeed config, activation checkpointing, the attention kernel, threads, workers, and the micro-batch ×
accumulation split (their product × the processes, the effective batch, is compared instead). A finished sft
run on one node is therefore not redone when mars runs on two.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from prove.common.checkpoint import read_prove_json
from prove.train.config import Stage, TrainConfig, config_dict
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

IGNORED: tuple[str, ...] = (
    # where things go, and what the run is called
    "run_name", "run_dir", "output_dir", "trainer.output_dir", "data.cache_dir", "logger",
    # the relaunch knobs, and the on-policy rounds' plan (a round's stage compares what it sets: its proposer,
    # init_from, data, max_steps; adding a round redoes none of the earlier ones)
    "resume", "force", "rounds", "round", "steps", "distill.reserve_prompts",
    # top-level knobs: interpolated into the groups, which are compared
    "block_size", "max_len", "lr", "epochs", "max_steps", "stages",
    # logging and checkpoint cadence
    "trainer.logging_steps", "trainer.save_steps", "trainer.save_total_limit",
    # a wall-time cap: a stage that ran all its steps is the same model whatever the cap (one it cut short resumes)
    "trainer.max_minutes",
    # how the work is laid out (the effective batch is compared instead of its split)
    "deepspeed", "cpu_threads", "data.num_proc", "model.attn_implementation", "trainer.activation_checkpointing",
    "trainer.dataloader_num_workers", "trainer.per_device_train_batch_size", "trainer.gradient_accumulation_steps",
    "stage.ce_chunk_rows", "stage.attention",
    # when and how the held-out rows are scored (eval.rows, eval.best and eval.block_size change the model written)
    "eval.steps", "eval.batch_size", "eval.tau",
)  # fmt: skip
"""Dotted config keys (a key covers everything under it) that "the same config" leaves out."""
IGNORED_UNLESS: dict[str, Stage] = {
    "distill": Stage.distill,
    "stage.block_size": Stage.mars,
    "stage.ar_weight": Stage.mars,
    "stage.depth_decay": Stage.mars,
    "eval": Stage.mars,
}
"""Keys only one stage reads: left out for the others (sft's model does not depend on K)."""
START_RECORD = "stage_start.json"
"""``{"training_config", "world_size"}`` of the launch that last trained the stage, written when it starts."""
TRAINER_STATE_NAME = "trainer_state.json"
"""The file the Trainer writes last into a ``checkpoint-N`` (``transformers.trainer.TRAINER_STATE_NAME``)."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """What the launch does: skip the stage, or train it from ``resume_from`` (``None``: its first step)."""

    skip: bool
    resume_from: str | None
    message: str
    """The line the launch logs."""
    finished: dict[str, Any] | None = None
    """The finished ``prove.json``'s ``extra`` when there is one (``global_step``, ``stopped_early``...)."""


def world_size(environ: dict[str, str] | None = None) -> int:
    return int((os.environ if environ is None else environ).get("WORLD_SIZE", "1"))


def comparable(config: dict[str, Any], stage: str, processes: int | None) -> dict[str, Any]:
    """``config`` (``config_dict``) flattened to dotted keys without :data:`IGNORED`, plus its effective batch."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = node

    walk("", config)
    ignored = [*IGNORED, *(k for k, only in IGNORED_UNLESS.items() if str(only) != stage)]
    out = {k: v for k, v in flat.items() if not any(k == i or k.startswith(i + ".") for i in ignored)}
    t = config.get("trainer") or {}
    micro, accumulation = (
        int(t.get("per_device_train_batch_size", 0)),
        int(t.get("gradient_accumulation_steps", 0)),
    )
    if processes is None:  # a prove.json from before it recorded its processes: compare the split itself
        out["trainer.per_device_train_batch_size"] = micro
        out["trainer.gradient_accumulation_steps"] = accumulation
    else:
        out["effective_batch"] = micro * accumulation * processes
    return out


def config_differences(cfg: TrainConfig, finished: dict[str, Any], processes: int | None = None) -> list[str]:
    """The keys in which this run's config differs from a finished ``prove.json``'s ``extra`` (empty: the same)."""
    recorded = finished.get("training_config") or {}
    old_processes = finished.get("world_size")
    now_processes = None if old_processes is None else (world_size() if processes is None else processes)
    stage = str(cfg.stage.name)
    now = comparable(config_dict(cfg), stage, now_processes)
    then = comparable(recorded, stage, old_processes)
    # a key the record lacks did not exist when it was written (a newer prove): it cannot have been set otherwise
    return sorted(k for k in then.keys() if now.get(k) != then[k])


def unrecorded_keys(cfg: TrainConfig, finished: dict[str, Any]) -> list[str]:
    """This run's keys that a finished ``prove.json`` does not record (written by an older prove, before they
    existed): :func:`config_differences` leaves them out, and the skip line names them."""
    recorded = finished.get("training_config") or {}
    stage = str(cfg.stage.name)
    now = comparable(config_dict(cfg), stage, None)
    then = comparable(recorded, stage, None)
    return sorted(now.keys() - then.keys())


def checkpoint_complete(folder: Path) -> bool:
    """Whether a ``checkpoint-N`` folder was written to the end: the Trainer writes its ``trainer_state.json``
    last (after the weights, the optimizer and the RNG states), so a node that died mid-save leaves a folder
    without one, or with a truncated one."""
    try:
        json.loads((folder / TRAINER_STATE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return True


def checkpoints(output_dir: Path) -> list[Path]:
    """``output_dir``'s ``checkpoint-N`` folders, newest (highest N) first."""
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    found = [
        (int(m.group(1)), p)
        for p in (output_dir.iterdir() if output_dir.is_dir() else ())
        if p.is_dir() and (m := pattern.match(p.name))
    ]
    return [p for _, p in sorted(found, reverse=True)]


def newest_checkpoint(output_dir: Path) -> str | None:
    """The newest complete ``checkpoint-N`` (:func:`checkpoint_complete`); a newer half-written one is passed over."""
    return next((str(p) for p in checkpoints(output_dir) if checkpoint_complete(p)), None)


def record_start(cfg: TrainConfig, processes: int | None = None) -> None:
    """Write :data:`START_RECORD` for a launch that trains ``cfg``'s stage (rank 0, before training begins)."""
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "training_config": config_dict(cfg),
        "world_size": world_size() if processes is None else processes,
    }
    tmp = out / f".{START_RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(out / START_RECORD)


def read_start(output_dir: Path) -> dict[str, Any] | None:
    """:data:`START_RECORD` in ``output_dir`` (None: no launch of this prove trained there)."""
    try:
        return json.loads((output_dir / START_RECORD).read_text())
    except (OSError, ValueError):
        return None


def resume_differences(cfg: TrainConfig, record: dict[str, Any], processes: int | None = None) -> list[str]:
    """:func:`config_differences` against the record of the run being resumed, less a raised ``max_steps`` (which
    extends it)."""
    differs = config_differences(cfg, record, processes)
    then = ((record.get("training_config") or {}).get("trainer") or {}).get("max_steps")
    now = cfg.trainer.max_steps
    if "trainer.max_steps" in differs and isinstance(then, int) and then > 0 and now > then:
        differs.remove("trainer.max_steps")
    return differs


def _value(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _refuse_resume(
    cfg: TrainConfig, name: str, resume_from: str, record: dict[str, Any], differs: list[str]
) -> None:
    """Raise the one-line ``ValueError`` for a resume whose config differs from its run's (``differs``); nothing
    when only config keys differ and ``resume=true`` asked for it."""
    ckpt = Path(resume_from).name
    then = record.get("training_config") or {}
    now = config_dict(cfg)
    t_then = then.get("trainer") or {}
    procs_then, procs_now = record.get("world_size"), world_size()
    batch_keys = {
        "effective_batch",
        "trainer.per_device_train_batch_size",
        "trainer.gradient_accumulation_steps",
    }
    if batch_keys & set(differs):
        micro, acc = cfg.trainer.per_device_train_batch_size, cfg.trainer.gradient_accumulation_steps
        m0, a0 = (
            int(t_then.get("per_device_train_batch_size", 0)),
            int(t_then.get("gradient_accumulation_steps", 0)),
        )
        p0 = int(procs_then) if procs_then is not None else procs_now
        want = m0 * a0 * p0
        fix = ""
        if want % (micro * procs_now) == 0:
            fix = f"set trainer.gradient_accumulation_steps={want // (micro * procs_now)} to keep it, or "
        raise ValueError(
            f"{name}: {ckpt} was trained at an effective batch of {want} (micro-batch {m0} × accumulation {a0} × "
            f"{p0} processes), this launch's is {micro * acc * procs_now} ({micro} × {acc} × {procs_now}), and "
            f"the resume would skip the wrong rows: {fix}force=true trains from the first step"
        )
    if cfg.resume is True:
        return
    shown = ", ".join(f"{k} {_value(then, k)!r} → {_value(now, k)!r}" for k in differs[:6])
    more = f" and {len(differs) - 6} more" if len(differs) > 6 else ""
    raise ValueError(
        f"{name}: {ckpt} was trained with another config ({shown}{more}): force=true trains from the first step "
        f"with this one, resume=true continues from {ckpt} with it, or relaunch with the old values"
    )


def check_inputs_finished(cfg: TrainConfig) -> None:
    """A ``ValueError`` when a checkpoint this stage builds on — ``stage.init_from``, and stage distill's
    ``distill.proposer`` — is one its wall-time cap cut short (``stopped_early`` in its prove.json): that stage is
    not finished (a relaunch resumes it), and a model trained or a set generated from it now would be built on an
    under-trained one. ``make train`` runs each step after the last one returns, so without this a capped stage's
    successor would start on it."""
    inputs = [("stage.init_from", cfg.stage.init_from)]
    if str(cfg.stage.name) == "distill":
        inputs.append(("distill.proposer", cfg.distill.proposer))
    for key, path in inputs:
        if not path or not (Path(path) / "prove.json").is_file():
            continue
        early = (read_prove_json(path).extra or {}).get("stopped_early")
        if early:
            raise ValueError(
                f"{key}={path} is not finished: its wall-time cap stopped it at step {early.get('step')} of "
                f"{early.get('max_steps')}. Relaunch the stage that writes it first (it resumes from its last "
                f"checkpoint; make train reruns every step in order), raising {early.get('setting') or 'its cap'} "
                "if the cap stops it again"
            )


def plan_stage(cfg: TrainConfig) -> StagePlan:
    """The rule of the module docstring for ``cfg``'s stage and output folder."""
    out = Path(cfg.trainer.output_dir)
    name = f"stage {cfg.stage.name} ({cfg.stage.role})"
    meta = read_prove_json(out) if (out / "prove.json").is_file() else None
    finished = meta.extra if meta is not None else None
    early = (finished or {}).get("stopped_early")
    last = newest_checkpoint(out)
    if cfg.resume is True and last is None:
        raise ValueError(
            f"resume=true but {out} has no complete checkpoint-* folder: drop resume=true to start fresh"
        )
    if cfg.force:
        if finished is not None:
            return StagePlan(
                False, None, f"{name}: force=true: training {out} again from its first step", finished
            )
        return StagePlan(False, None, f"{name}: force=true: training {out} from its first step", None)
    if finished is not None and early:
        # cut short by its wall-time cap: not finished, whatever prove.json says; it continues like a crashed one
        why = (
            f"{name}: its wall-time cap stopped {out} at step {early.get('step')} of {early.get('max_steps')}"
        )
    elif finished is not None:
        differs = config_differences(cfg, finished)
        if not differs:
            msg = f"{name}: {out} holds a finished prove.json of the same config: skipping (force=true trains it again)"
            newer = unrecorded_keys(cfg, finished)
            if newer:
                shown = ", ".join(newer[:8]) + (f" and {len(newer) - 8} more" if len(newer) > 8 else "")
                msg += f"; it was written before {shown} existed"
            return StagePlan(True, None, msg, finished)
        shown = ", ".join(differs[:8]) + (f" and {len(differs) - 8} more" if len(differs) > 8 else "")
        why = f"{name}: {out} holds a finished prove.json of another config (differs in {shown})"
        if cfg.resume is not True:  # its checkpoints belong to that other config
            tail = f" (resume=true continues from {last} instead)" if last else ""
            return StagePlan(False, None, f"{why}: training from its first step{tail}", finished)
    else:
        why = f"{name}: training {out}"
    resume_from = last if cfg.resume is not False else None
    if resume_from:
        record = read_start(out) or (finished if early else None)
        differs = resume_differences(cfg, record) if record is not None else []
        if differs:
            _refuse_resume(cfg, name, resume_from, record or {}, differs)
        why += f", resuming from {resume_from}"
        if differs:  # resume=true: on purpose
            why += f" with another config than its checkpoints' ({', '.join(differs)}; resume=true)"
        torn = [p.name for p in checkpoints(out)[: [str(c) for c in checkpoints(out)].index(resume_from)]]
        if torn:
            why += f" ({', '.join(torn)}: no complete {TRAINER_STATE_NAME}, a save cut short; passed over)"
    elif last:
        why += f" from its first step (resume=false; {last} is left unused)"
    return StagePlan(False, resume_from, why, finished)
