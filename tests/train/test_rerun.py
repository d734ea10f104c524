"""Relaunching a stage: a finished prove.json of the same config is skipped (force=true trains it again), another
config or a half-finished stage trains and resumes; `make train-proposer` rerun after a kill during mars leaves sft
untouched and resumes mars."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from prove.common.checkpoint import ProveMeta, write_prove_json
from prove.train.config import config_dict
from prove.train.rerun import IGNORED, START_RECORD, config_differences, plan_stage, record_start

from tests.train.helpers import ROOT, tiny_overrides, train_config


def _finish(cfg, world_size: int = 1, **extra) -> None:
    """Write the prove.json a finished run of ``cfg`` leaves."""
    meta = ProveMeta(
        stage=str(cfg.stage.name),
        base_model="scratch",
        extra={"training_config": config_dict(cfg), "world_size": world_size, "global_step": 8, **extra},
    )
    Path(cfg.trainer.output_dir).mkdir(parents=True, exist_ok=True)
    write_prove_json(Path(cfg.trainer.output_dir), meta)


def _checkpoint(folder: Path, state: str = '{"global_step": 2}') -> None:
    """A ``checkpoint-N`` the Trainer finished writing: its trainer_state.json (written last) is there."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(state)


def test_a_finished_stage_of_the_same_config_is_skipped_unless_forced(tmp_path):
    base = tiny_overrides(tmp_path, tmp_path / "d.jsonl", stage="sft")
    cfg = train_config(base)
    assert not plan_stage(cfg).skip  # nothing there yet
    _finish(cfg)
    plan = plan_stage(cfg)
    assert plan.skip and "finished prove.json of the same config: skipping (force=true" in plan.message
    # what "the same" leaves out: logging, saving cadence, where outputs go, how the work is laid out
    laid_out = train_config(
        [*base, "trainer.logging_steps=5", "trainer.save_steps=7", "deepspeed=zero3", "logger=wandb",
         "trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=2", "cpu_threads=3",
         "model.attn_implementation=sdpa", "stage.attention=mask", "block_size=8", "distill.num_prompts=3"]
    )  # fmt: skip
    assert config_differences(laid_out, json.loads((tmp_path / "sft" / "prove.json").read_text())) == []
    assert plan_stage(laid_out).skip
    # a prove.json written before a key existed (an older prove) is still the same config; the line names the key
    old = config_dict(cfg)
    del old["trainer"]["seed"]
    assert config_differences(cfg, {"training_config": old, "world_size": 1}) == []
    write_prove_json(
        Path(cfg.trainer.output_dir),
        ProveMeta(stage="sft", base_model="scratch", extra={"training_config": old, "world_size": 1}),
    )
    plan = plan_stage(cfg)
    assert plan.skip and plan.message.endswith("; it was written before trainer.seed existed")
    _finish(cfg)
    # the effective batch is compared: micro-batch 8 × accumulation 1 on 1 process is 4 × 1 on 2 processes
    assert config_differences(
        train_config([*base, "trainer.per_device_train_batch_size=4"]), {"training_config": config_dict(cfg), "world_size": 1}, processes=2
    ) == []  # fmt: skip
    # what it does not: a different model, schedule or batch trains — from its first step, the checkpoints being
    # the other config's, unless resume=true continues from the newest
    _checkpoint(tmp_path / "sft" / "checkpoint-4")
    longer = train_config([*base, "max_steps=12"])
    plan = plan_stage(longer)
    assert not plan.skip and plan.resume_from is None
    assert (
        "another config (differs in trainer.max_steps): training from its first step (resume=true"
        in plan.message
    )
    assert plan_stage(train_config([*base, "max_steps=12", "resume=true"])).resume_from.endswith(
        "checkpoint-4"
    )
    bigger = train_config([*base, "trainer.gradient_accumulation_steps=2"])
    assert config_differences(bigger, plan_stage(cfg).finished) == ["effective_batch"]
    # force: trained again from its first step, the checkpoints of the finished run unused
    forced = plan_stage(train_config([*base, "force=true"]))
    assert not forced.skip and forced.resume_from is None and "force=true" in forced.message
    with pytest.raises(ValueError, match="drop one of them"):
        train_config([*base, "force=true", "resume=true"])
    # resume=false decides about checkpoints of an cfg stage, not about a finished one
    assert plan_stage(train_config([*base, "resume=false"])).skip
    assert {"deepspeed", "logger", "trainer.logging_steps", "output_dir"} <= set(IGNORED)


def test_a_half_finished_stage_resumes_and_block_size_matters_only_to_mars(tmp_path):
    base = tiny_overrides(tmp_path, tmp_path / "d.jsonl", stage="mars")
    cfg = train_config(base)
    _checkpoint(tmp_path / "mars" / "checkpoint-2")
    plan = plan_stage(cfg)
    assert not plan.skip and plan.resume_from.endswith("checkpoint-2") and "resuming from" in plan.message
    fresh = plan_stage(train_config([*base, "resume=false"]))
    assert fresh.resume_from is None and "first step (resume=false" in fresh.message
    _finish(cfg)
    assert plan_stage(cfg).skip
    assert not plan_stage(train_config([*base, "block_size=8"])).skip  # K is what mars trains
    # a stage its wall-time cap cut short is not finished: a relaunch resumes it (any cap)
    early = {
        "reason": "max_minutes",
        "step": 2,
        "max_steps": 8,
        "max_minutes": 1.0,
        "setting": "trainer.max_minutes",
    }
    _finish(cfg, stopped_early=early)
    plan = plan_stage(train_config([*base, "trainer.max_minutes=5"]))
    assert not plan.skip and plan.resume_from.endswith("checkpoint-2")
    assert "its wall-time cap stopped" in plan.message and "at step 2 of 8, resuming from" in plan.message
    _finish(cfg)  # one that ran all its steps is the same model whatever its cap
    assert plan_stage(train_config([*base, "trainer.max_minutes=5"])).skip
    (tmp_path / "mars" / "prove.json").unlink()  # it crashes instead, several times
    # a save the node died in: the weights are there, the trainer state (written last) is missing or cut short;
    # the newest complete one is resumed (by number, not by name: checkpoint-10 is newer than checkpoint-2)
    (tmp_path / "mars" / "checkpoint-10").mkdir()
    (tmp_path / "mars" / "checkpoint-10" / "model.safetensors").write_bytes(b"\0" * 8)
    _checkpoint(tmp_path / "mars" / "checkpoint-8", state='{"global_step": 8, "log_hi')
    _checkpoint(tmp_path / "mars" / "checkpoint-6")
    plan = plan_stage(cfg)
    assert plan.resume_from.endswith("checkpoint-6"), plan.message
    assert "(checkpoint-10, checkpoint-8: no complete trainer_state.json" in plan.message
    _checkpoint(tmp_path / "mars" / "checkpoint-10")
    assert plan_stage(cfg).resume_from.endswith("checkpoint-10")


def test_a_resume_with_another_config_or_effective_batch_is_refused_at_start(tmp_path, monkeypatch):
    """Catches a resume that silently changes the run: a capped (stopped_early) prove.json once bypassed the
    comparison, and a mid-stage resume never compared the config or the effective batch with its checkpoints'."""
    base = tiny_overrides(tmp_path, tmp_path / "d.jsonl", stage="mars", max_steps=8)
    cfg = train_config(base)
    _checkpoint(tmp_path / "mars" / "checkpoint-2")
    # a capped run (no start record: written by an older prove) relaunched with another lr and K
    early = {
        "reason": "max_minutes",
        "step": 2,
        "max_steps": 8,
        "max_minutes": 1.0,
        "setting": "trainer.max_minutes",
    }
    _finish(cfg, stopped_early=early)
    with pytest.raises(
        ValueError,
        match=r"checkpoint-2 was trained with another config \(stage.block_size 4 → 8, "
        r"trainer.learning_rate .*force=true trains from the first step.*resume=true continues",
    ):
        plan_stage(train_config([*base, "lr=0.5", "block_size=8"]))
    # raising max_steps extends the capped run; lowering it is another schedule
    assert plan_stage(train_config([*base, "max_steps=16"])).resume_from.endswith("checkpoint-2")
    with pytest.raises(ValueError, match=r"trainer.max_steps 8 → 6"):
        plan_stage(train_config([*base, "max_steps=6"]))
    # resume=true: on purpose, said in the line
    plan = plan_stage(train_config([*base, "lr=0.5", "resume=true"]))
    assert (
        plan.resume_from.endswith("checkpoint-2") and "(trainer.learning_rate; resume=true)" in plan.message
    )
    (tmp_path / "mars" / "prove.json").unlink()
    # a crashed run: compared with what its launch recorded when it started (2 processes, micro 8 × accumulation 1)
    record_start(cfg, processes=2)
    assert json.loads((tmp_path / "mars" / START_RECORD).read_text())["world_size"] == 2
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(
        ValueError,
        match=r"effective batch of 16 .*this launch's is 8 .*"
        r"set trainer.gradient_accumulation_steps=2 to keep it, or force=true",
    ):
        plan_stage(cfg)
    with pytest.raises(
        ValueError, match="effective batch"
    ):  # resume=true does not make the skipped rows right
        plan_stage(train_config([*base, "resume=true"]))
    assert plan_stage(train_config([*base, "trainer.gradient_accumulation_steps=2"])).resume_from is not None
    with pytest.raises(ValueError, match=r"stage.ar_weight 1.0 → 0.5"):
        plan_stage(train_config([*base, "trainer.gradient_accumulation_steps=2", "stage.ar_weight=0.5"]))
    assert plan_stage(train_config([*base, "lr=0.5", "force=true"])).resume_from is None
    assert plan_stage(train_config([*base, "lr=0.5", "resume=false"])).resume_from is None


def _make(run_dir: Path, data: Path) -> subprocess.Popen:
    args = " ".join(
        [f"run_dir={run_dir}", f"data.path={data}", "stages.proposer.layers=2", "model.scratch.hidden=32",
         "model.scratch.heads=2", "model.scratch.kv_heads=2", "model.scratch.intermediate=64",
         "model.scratch.vocab_size=300", "model.scratch.tokenizer_rows=256", "max_len=128",
         "stages.proposer.sft.max_steps=4", "stages.proposer.mars.max_steps=30", "trainer.save_steps=3",
         "trainer.per_device_train_batch_size=8", "trainer.logging_steps=1"]
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = ["make", "--no-print-directory", "-o", ".venv/.prove-installed", "train-proposer", "RECIPE=tiny",
           "NNODES=1", "GPUS_PER_NODE=1", f"ARGS={args}"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


@pytest.mark.slow
def test_rerunning_train_proposer_after_a_kill_during_mars_leaves_sft_untouched(tmp_path, arithmetic_jsonl):
    run_dir = tmp_path / "runs"
    proc = _make(run_dir, arithmetic_jsonl)
    deadline = time.monotonic() + 300
    while not list((run_dir / "mars").glob("checkpoint-*/trainer_state.json")):  # mars saved once
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the node dies mid-stage
    proc.wait()
    assert not (run_dir / "mars" / "prove.json").exists()
    # and, as often happens, in the middle of a save: the next checkpoint has its weights, not its trainer state
    # (a kill above may have made one already; CI once resumed into such a folder and failed)
    steps = sorted(
        int(p.parent.name.split("-")[1]) for p in (run_dir / "mars").glob("checkpoint-*/trainer_state.json")
    )
    torn = run_dir / "mars" / f"checkpoint-{steps[-1] + 3}"
    if not torn.exists():
        shutil.copytree(run_dir / "mars" / f"checkpoint-{steps[-1]}", torn)
        (torn / "trainer_state.json").unlink()
    sft = {p.name: p.stat().st_mtime_ns for p in (run_dir / "sft").iterdir() if p.is_file()}
    tokenized = sorted(p.name for p in (run_dir / "tokenized").iterdir())

    rerun = _make(run_dir, arithmetic_jsonl)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out[-4000:]
    assert (
        "stage sft (proposer)" in out and "of the same config: skipping (force=true trains it again)" in out
    )
    assert "stage mars (proposer): training" in out and "resuming from" in out
    assert "no complete trainer_state.json, a save cut short; passed over" in out
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "sft").iterdir() if p.is_file()} == sft
    meta = json.loads((run_dir / "mars" / "prove.json").read_text())
    assert meta["global_step"] == 30
    # sft's tokenized set served mars too (the cache key leaves <|mask|> out): one set, built once
    assert sorted(p.name for p in (run_dir / "tokenized").iterdir()) == tokenized and len(tokenized) == 1


def test_a_stage_does_not_start_on_a_checkpoint_its_cap_cut_short(tmp_path):
    """``make train`` runs each step after the previous one returns, also when a wall-time cap stopped it: a stage
    whose ``stage.init_from`` (or stage distill's ``distill.proposer``) is such a capped checkpoint is refused at
    start, naming the cap's setting; the same checkpoint once finished is accepted. Catches: the check reading the
    stage's own output instead of its input, a capped proposer passing for distill, the refusal coming after the
    logger opened or a set was generated."""
    from prove.train.pipeline import train

    sft = train_config(tiny_overrides(tmp_path, tmp_path / "d.jsonl", stage="sft"))
    early = {
        "reason": "max_minutes",
        "step": 3,
        "max_steps": 8,
        "setting": "stages.proposer.mars.max_minutes",
    }
    _finish(sft, stopped_early=early)
    src = sft.trainer.output_dir
    mars = tiny_overrides(tmp_path, tmp_path / "d.jsonl", stage="mars", **{"stage.init_from": src})
    with pytest.raises(
        ValueError, match=r"stage.init_from=.* is not finished: .* step 3 of 8.*mars.max_minutes"
    ):
        train(train_config(mars))
    verifier = tmp_path / "verifier-sft"  # a finished verifier to start from
    verifier.mkdir()
    write_prove_json(verifier, ProveMeta(stage="sft", base_model="scratch"))
    distill = tiny_overrides(
        tmp_path, tmp_path / "d.jsonl", stage="distill",
        **{"distill.proposer": src, "stage.init_from": str(verifier)},
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"distill.proposer=.* is not finished"):
        train(train_config(distill))
    assert not (tmp_path / "mars").exists() and not any(tmp_path.glob("distill*"))
    _finish(sft)  # the relaunch ran all its steps: accepted (the check passes; the stage then needs its data)
    from prove.train.rerun import check_inputs_finished

    check_inputs_finished(train_config(mars))
    check_inputs_finished(train_config(distill))
