"""``train(cfg)``: one stage of the pipeline (docs/design.md §2), end to end, the same steps for every stage.

The stage's unit (:mod:`prove.train.stages`) supplies what differs between sft, mars and distill:

0) ``unit.prepare``: work before TrainingArguments (distill: join the process group, generate this rank's share
   of the proposer's responses and wait for the other ranks, so that under ZeRO-3 the proposer loads whole);
   a stage with nothing to train ends here (``unit.untrained_output``: distill with ``distill.train=false``);
1) TrainingArguments (under ZeRO-3 they make ``from_pretrained`` load weights partitioned);
2) tokenizer and model: from ``stage.init_from`` / ``model.name_or_path``, or a tiny Qwen2 from scratch
   (:mod:`prove.train.modeling`);
3) ``<|mask|>``: added when ``unit.adds_mask_token`` (mars: a spare embedding row, else resize), else looked up;
4) ``unit.dataset``: the tokenized conversations, or distill's generated set;
5) optional LoRA; 6) ``unit.trainer`` with ``unit.collator``, resuming from the last checkpoint in ``output_dir``
   (through a universal checkpoint when another number of processes wrote it, :mod:`prove.train.universal`);
7) save the checkpoint contract of docs/design.md §2.2 (:mod:`prove.train.saving`).

Before any of it :func:`prove.train.rerun.plan_stage` reads the output folder: a finished ``prove.json`` of the same
config skips the stage (``force=true`` trains it again); otherwise it says where training resumes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch
from prove.train.config import PeftKind, TrainConfig, run_label
from prove.train.launch import one_process_rendezvous
from prove.train.modeling import apply_lora, build_model_and_tokenizer, mask_token_id
from prove.train.rerun import StagePlan, check_inputs_finished, plan_stage, record_start, world_size
from prove.train.rounds import for_round
from prove.train.saving import barrier, prove_meta, save_checkpoint
from prove.train.stages import stage_unit
from prove.train.threads import require_cpu_adam, set_cpu_threads
from prove.train.tracking import open_logger
from prove.train.trainer import CadenceCallback, WallClockCallback
from prove.train.universal import UniversalResumeCallback, prepare_resume
from transformers import TrainingArguments

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What a finished stage left behind."""

    output_dir: Path
    global_step: int
    train_loss: float | None
    stopped_by_wall_clock: bool
    log_history: list[dict[str, Any]]
    stopped_early: dict[str, Any] | None = None
    """Set when the wall-clock cap ended the stage before its last step: ``{"reason": "max_minutes", "step",
    "max_steps", "max_minutes", "setting"}`` (``WallClockCallback.stopped_early``; prove.json records it too)."""
    model: Any = dataclasses.field(default=None, repr=False, compare=False)
    """The trained model as training left it (under DeepSpeed: the engine's module, still partitioned)."""
    skipped: bool = False
    """The output folder held a finished checkpoint of the same config: nothing ran (:mod:`prove.train.rerun`)."""


def train(cfg: TrainConfig) -> StageResult:
    """Run one stage, or skip it when its output is already a finished checkpoint of the same config; the logger
    is always closed, also when training fails. ``cfg.round`` ≥ 2 trains that on-policy round's stage
    (:func:`prove.train.rounds.for_round`)."""
    cfg = for_round(cfg)
    plan = plan_stage(cfg)
    log.info("%s", plan.message)
    if plan.skip:
        done = plan.finished or {}
        return StageResult(
            Path(cfg.trainer.output_dir), int(done.get("global_step") or 0), None, False, [],
            stopped_early=done.get("stopped_early"), skipped=True,
        )  # fmt: skip
    check_inputs_finished(cfg)  # a capped stage's successor does not start on its under-trained model
    set_cpu_threads(cfg)  # before DeepSpeed builds a CPU optimizer
    require_cpu_adam(cfg.deepspeed)  # built now, or refused in one line
    tracker = open_logger(cfg, resuming=plan.resume_from is not None)  # the same wandb run when it resumes
    try:
        return _run(cfg, tracker, plan)
    finally:
        tracker.close()


def _run(cfg: TrainConfig, tracker: Any, plan: StagePlan) -> StageResult:
    unit = stage_unit(cfg.stage.name)
    unit.prepare(cfg)  # 0)
    if (generated := unit.untrained_output(cfg)) is not None:  # only the generated set: nothing to train
        return StageResult(generated, 0, None, False, [])
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:  # what a later resume must match (prove.json comes only at the end)
        record_start(cfg)
    ds = prepare_resume(plan.resume_from, cfg.deepspeed, world_size(), rank)  # another world size: universal
    universal_resume = ds is not cfg.deepspeed
    if universal_resume:
        cfg = dataclasses.replace(cfg, deepspeed=ds)
    args = training_arguments(cfg, report_to=tracker.report_to)  # 1)
    tokenizer, model, base_model = build_model_and_tokenizer(cfg, args)  # 2)
    mask_id = mask_token_id(model, tokenizer, cfg.stage.mask_token, add=unit.adds_mask_token)  # 3)
    dataset = unit.dataset(cfg, tokenizer, args)  # 4)
    dataset, eval_set = unit.split_eval(cfg, dataset)  # the held-out rows (stage mars's eval.rows), or None
    if cfg.peft.kind == PeftKind.lora:  # 5)
        model = apply_lora(model, cfg, mask_id if unit.lora_trains_mask_token else None)
    wall = None
    if cfg.trainer.max_minutes is not None:
        wall = WallClockCallback(cfg.trainer.max_minutes, max_minutes_setting(cfg))
    trainer = unit.trainer(  # 6)
        cfg,
        mask_id,
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_set,
        data_collator=unit.collator(cfg, tokenizer),
        processing_class=tokenizer,
        callbacks=[CadenceCallback(), *([wall] if wall else [])],
    )
    if universal_resume:  # load_universal for the resume's own load only
        trainer.add_callback(UniversalResumeCallback(trainer))
    result = trainer.train(resume_from_checkpoint=plan.resume_from)
    stopped_early = wall.stopped_early if wall else None
    meta = prove_meta(
        cfg,
        unit,
        base_model,
        mask_id,
        stopped_early=stopped_early,
        global_step=trainer.state.global_step,
        evaluation=unit.eval_record(trainer),
    )
    save_checkpoint(trainer, cfg, Path(cfg.trainer.output_dir), meta)  # 7)
    barrier()  # every rank returns after rank 0 has written prove.json
    return StageResult(
        output_dir=Path(cfg.trainer.output_dir),
        global_step=trainer.state.global_step,
        train_loss=getattr(result, "training_loss", None),
        stopped_by_wall_clock=bool(wall and wall.stopped_at_step is not None),
        log_history=list(trainer.state.log_history),
        stopped_early=stopped_early,
        model=trainer.model_wrapped,
    )


def max_minutes_setting(cfg: TrainConfig) -> str:
    """The override that sets this stage's wall-clock cap: a recipe's per-stage knob where the recipe has
    one (``stages.<role>.<stage>.max_minutes``), else ``trainer.max_minutes``."""
    role, name = str(cfg.stage.role), str(cfg.stage.name)
    knobs = (cfg.stages or {}).get(role) or {}
    if "max_minutes" in (knobs.get(name) or {}):
        return f"stages.{role}.{name}.max_minutes"
    return "trainer.max_minutes"


TRAINER_OWN = frozenset({"max_minutes", "extra", "activation_checkpointing", "group_by_length"})
"""``TrainerConfig`` fields :func:`training_arguments` does not pass on under their own name: ours, or mapped to the
name the installed ``TrainingArguments`` declares. Every other field is a ``TrainingArguments`` argument
(``tests/train/test_trainer_config_fields.py`` checks them against the installed transformers)."""


def training_arguments(cfg: TrainConfig, report_to: list[str]) -> TrainingArguments:
    """``TrainingArguments`` from ``cfg.trainer`` (+ ``cfg.deepspeed``); built before the model on purpose."""
    t = cfg.trainer
    use_cpu = not torch.cuda.is_available()
    if cfg.deepspeed is not None:
        one_process_rendezvous()  # prove-train started alone (one CPU or GPU): rank 0 of 1, not MPI's discovery
    if cfg.deepspeed is not None and use_cpu:
        import deepspeed  # an optional dependency (prove[deepspeed]): imported only when a run asks for it

        deepspeed.init_distributed(dist_backend="gloo")
    known = {f.name for f in dataclasses.fields(t)} - TRAINER_OWN
    kwargs = {name: getattr(t, name) for name in known}
    # transformers 5.24 calls gradient checkpointing activation checkpointing (the old name a deprecated alias);
    # vLLM pins transformers < 5.20, which knows only the old one: pass the name this TrainingArguments declares.
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    kwargs[ckpt] = t.activation_checkpointing
    kwargs[f"{ckpt}_kwargs"] = {"use_reentrant": False} if t.activation_checkpointing else None
    if t.group_by_length:
        # transformers 5.24 names it train_sampling_strategy; older ones (vLLM's pin) take group_by_length=True
        if "train_sampling_strategy" in names:
            kwargs["train_sampling_strategy"] = "group_by_length"
        else:
            kwargs["group_by_length"] = True
    if cfg.eval.best and str(cfg.stage.name) == "mars":
        # the Trainer then tracks the best checkpoint, and its rotation (save_total_limit) keeps it
        kwargs["metric_for_best_model"] = cfg.eval.metric(cfg.stage.block_size)
        kwargs["greater_is_better"] = True
    kwargs.update(t.extra)
    return TrainingArguments(
        **kwargs,
        use_cpu=use_cpu,
        deepspeed=cfg.deepspeed,
        report_to=report_to,
        run_name=run_label(cfg),
        remove_unused_columns=False,
    )
