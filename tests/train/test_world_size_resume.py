"""The one-node path of the 32B recipe in small: ZeRO-3 with the optimizer offloaded to the CPU, 2 processes (gloo),
then a relaunch on 1 process (accumulation doubled: the same effective batch) that resumes the 2-process
checkpoint through DeepSpeed's universal format — the weights, the optimizer's moments and step, the schedule and
the eval history continue as the uninterrupted run's, and ``eval.best`` loads a best checkpoint written after the
move."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from tests.train.helpers import tiny_overrides, torchrun, write_checkpoint


def _mars(tmp_path, run: str, sft, data, nproc: int, accumulation: int, best_at: int) -> dict:
    overrides = tiny_overrides(
        tmp_path / run,
        data,
        model="hf",
        stage="mars",
        deepspeed="zero3_offload_optimizer",
        max_steps=4,
        lr=1e-3,
        **{
            "deepspeed.optimizer.params.torch_adam": "true",  # the offload path without building CPU Adam
            "model.name_or_path": str(sft),
            "stage.init_from": str(sft),
            "trainer.per_device_train_batch_size": 4,
            "trainer.gradient_accumulation_steps": accumulation,
            "trainer.save_steps": 1,  # a resume keeps its checkpoint's cadence (the Trainer restores it)
            "trainer.save_total_limit": "null",
            "trainer.lr_scheduler_type": "linear",
            "eval.rows": 8,  # acceptance scored at each save: its history must survive the move
            "eval.best": "true",
        },
    )
    out = tmp_path / f"{run}.pt"
    proc = torchrun("zero3_driver.py", [str(out), f"--best-at={best_at}", "--probe", *overrides], nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out)


@pytest.mark.slow
def test_offloaded_zero3_resumes_on_another_world_size_through_a_universal_checkpoint(
    tmp_path, tokenizer, qwen2_factory, arithmetic_jsonl
):
    """Catches a resume that loses the optimizer state (moments compared with the universal files, not a loss
    within 10%, which a fresh optimizer passes too), or the weights (the loss on a fixed batch right after the
    load against the one at the saved step), a restarted schedule, and ``load_universal`` left on after the
    resume (``eval.best``'s load of a checkpoint the resumed run wrote then wants a ``latest_universal``)."""
    pytest.importorskip("deepspeed")
    from prove.train.rerun import START_RECORD
    from prove.train.universal import saved_world_size, universal_dir

    sft = write_checkpoint(
        tmp_path / "sft",
        qwen2_factory(
            len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        ),
        tokenizer,
    )
    whole = _mars(tmp_path, "two", sft, arithmetic_jsonl, nproc=2, accumulation=1, best_at=4)
    assert whole["world_size"] == 2 and whole["global_step"] == 4
    assert whole["cpu_offload"]  # the optimizer step ran on the CPU
    # the per-process thread count was set by prove-train, not left at torchrun's 1: the node's cores / 2 processes
    from prove.train.threads import node_cores, rank_threads

    assert whole["threads"] == rank_threads(node_cores(), 2) and whole["omp_num_threads"] == str(
        whole["threads"]
    )

    # a crash after step 2: only checkpoint-2 of the 2-process run is left (and the launch's start record, which
    # the resume's effective batch is checked against); relaunch on 1 process, accumulation 2, saving every step
    ckpt = tmp_path / "one" / "mars" / "checkpoint-2"
    shutil.copytree(tmp_path / "two" / "mars" / "checkpoint-2", ckpt)
    shutil.copy(tmp_path / "two" / "mars" / START_RECORD, tmp_path / "one" / "mars" / START_RECORD)
    assert saved_world_size(ckpt) == 2 and universal_dir(ckpt) is None
    # the eval score peaks at step 3 (the 2-process run's at its last step, 4): a checkpoint the 1-process run
    # writes, not its last
    resumed = _mars(tmp_path, "one", sft, arithmetic_jsonl, nproc=1, accumulation=2, best_at=3)
    assert resumed["world_size"] == 1 and resumed["global_step"] == 4
    uni = universal_dir(ckpt)
    assert uni is not None  # converted once, kept beside the original

    # right after the load, before step 3: the weights are step 2's (the loss on a fixed batch, to fp32 rounding)
    assert resumed["resumed_at"] == 2
    assert resumed["loss_after_load"] == pytest.approx(whole["loss_at_step"][2], rel=1e-5, abs=1e-6)
    # ... and so is the optimizer: every parameter's Adam moments equal the universal checkpoint's files (fp32 to
    # fp32: the conversion is exact), the step count is 2
    moments = resumed["moments"]
    assert len(moments) > 10
    for name, state in moments.items():
        for key, value in state.items():
            saved = torch.load(uni / "zero" / name / f"{key}.pt", weights_only=False)
            saved = (saved["param"] if isinstance(saved, dict) else saved).float().flatten()
            assert torch.allclose(value.flatten(), saved, rtol=1e-6, atol=1e-12), (
                name,
                key,
            )
        assert state["exp_avg_sq"].abs().sum() > 0, name  # a fresh optimizer's are zero
    assert resumed["optimizer_steps"] == [2]

    by_step = {h["step"]: h for h in whole["logs"]}
    logged = {h["step"]: h for h in resumed["logs"]}
    assert sorted(logged) == [1, 2, 3, 4]  # steps 1-2 from the checkpoint's history, 3-4 trained here
    for step in (3, 4):
        # the schedule continues where it stopped (a restarted one would be back at its first learning rate)
        assert logged[step]["learning_rate"] == pytest.approx(by_step[step]["learning_rate"], rel=1e-6)
        assert math.isfinite(logged[step]["loss"])
    # the eval history came along: steps 1-2 from the checkpoint, 3 and 4 scored after the resume
    evals = {h["step"]: h for h in resumed["evals"]}
    assert sorted(evals) == [1, 2, 3, 4] and [h["step"] for h in whole["evals"]] == [1, 2, 3, 4]
    meta = json.loads((tmp_path / "one" / "mars" / "prove.json").read_text())
    assert meta["world_size"] == 1 and meta["global_step"] == 4
    # eval.best: checkpoint-3 (written after the move, no universal copy) is the stage's output, not the last step
    assert meta["eval"]["best"]["step"] == 3 and meta["eval"]["output"]["step"] == 3
    # ... and its weights are the stage's final model: checkpoint-3's, reloaded after step 4
    final, by_step_loss = resumed["final_loss"], resumed["loss_at_step"]
    assert final == pytest.approx(by_step_loss[3], rel=1e-5, abs=1e-6), (final, by_step_loss)
    assert final != pytest.approx(by_step_loss[4], rel=1e-4), (final, by_step_loss)


def _zero_checkpoint(path, ranks: int):
    """A checkpoint-N folder as the Trainer + DeepSpeed leave it (file names only)."""
    step = path / "global_step2"
    step.mkdir(parents=True)
    (path / "latest").write_text("global_step2")
    for r in range(ranks):
        (step / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"")
        (step / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").write_bytes(b"")
    return path


@pytest.mark.parametrize("rank", [0, 1])
def test_resume_config_converts_once_and_only_for_another_world_size(tmp_path, monkeypatch, rank):
    from prove.train import universal

    ckpt = _zero_checkpoint(tmp_path / "checkpoint-2", ranks=2)
    ds = {"zero_optimization": {"stage": 3}}
    assert universal.saved_world_size(ckpt) == 2
    assert universal.prepare_resume(str(ckpt), ds, world_size=2, rank=rank) is ds  # same count: as it is
    assert (
        universal.prepare_resume(None, ds, world_size=1, rank=rank) is ds
        and universal.prepare_resume(str(ckpt), None, 1, rank) is None
    )
    cmd = universal.convert_command(ckpt)
    assert cmd[1:3] == ["-m", "deepspeed.checkpoint.ds_to_universal"]
    assert cmd[cmd.index("--input_folder") + 1] == str(ckpt / "global_step2")
    assert cmd[cmd.index("--output_folder") + 1] == str(ckpt / "global_step2_universal")

    calls = []

    def fake_convert(path):  # what ds_to_universal leaves: the folder, then latest_universal
        calls.append(path)
        (ckpt / "global_step2_universal").mkdir()
        (ckpt / "latest_universal").write_text("global_step2_universal")

    monkeypatch.setattr(universal, "convert", fake_convert)
    if rank == 1:  # the other ranks wait for rank 0's file, outside any collective
        import threading

        threading.Timer(0.5, fake_convert, args=(str(ckpt),)).start()
    out = universal.prepare_resume(str(ckpt), ds, world_size=1, rank=rank)
    assert (
        out["checkpoint"] == {"load_universal": True} and out["zero_optimization"] == ds["zero_optimization"]
    )
    assert len(calls) == 1  # rank 0 converted (or, for rank 1, rank 0's stand-in did)
    again = universal.prepare_resume(str(ckpt), ds, world_size=4, rank=0)  # a later relaunch reuses the copy
    assert again["checkpoint"]["load_universal"] and len(calls) == 1


def test_the_newest_zero_state_is_found_by_number_not_by_name(tmp_path):
    """Catches a string sort of the ``global_step*`` folders (``global_step999`` after ``global_step1000``)."""
    from prove.train.universal import zero_step_dir

    for step in (999, 1000, 98):
        (tmp_path / f"global_step{step}").mkdir()
    (tmp_path / "global_step1000_universal").mkdir()  # the universal copy is no ZeRO state
    assert zero_step_dir(tmp_path).name == "global_step1000"


def test_the_waiting_ranks_raise_when_rank_0s_conversion_fails(tmp_path, monkeypatch):
    """Catches ranks that wait forever for a ``latest_universal`` that rank 0's failed conversion never writes, and
    a marker left by an earlier launch that would fail this one."""
    import subprocess
    import threading

    from prove.train import universal

    ckpt = _zero_checkpoint(tmp_path / "checkpoint-2", ranks=2)
    (ckpt / universal.FAILED).write_text("an earlier launch's failure")
    os.utime(ckpt / universal.FAILED, (1.0, 1.0))  # older than this process: ignored while waiting

    def failing(cmd, **kwargs):
        time.sleep(0.3)
        return subprocess.CompletedProcess(cmd, 1, "", "Killed (out of memory)")

    monkeypatch.setattr(universal.subprocess, "run", failing)
    errors: list[BaseException] = []

    def rank0():
        try:
            universal.ensure_universal(ckpt, rank=0)
        except RuntimeError as e:
            errors.append(e)

    waiter = threading.Timer(0.1, rank0)
    waiter.start()
    with pytest.raises(RuntimeError, match=r"(?s)failed.*Killed \(out of memory\)"):
        universal.wait_for(ckpt / universal.LATEST_UNIVERSAL, "rank 0 converts", poll_s=0.05,
                           failed=ckpt / universal.FAILED)  # fmt: skip
    waiter.join()
    assert errors and "run it by hand" in str(errors[0])


class _Engine:
    """What :func:`prove.train.universal.set_load_universal` reaches in a DeepSpeed engine, recording each load."""

    def __init__(self):
        from deepspeed.runtime.config import DeepSpeedConfig

        self._config = DeepSpeedConfig({"train_batch_size": 1, "checkpoint": {"load_universal": True}})
        self.loads: list[bool] = []

    def load(self):
        self.loads.append(self._config.load_universal_checkpoint)


def test_load_universal_is_set_only_for_a_checkpoint_another_world_size_wrote(tmp_path, monkeypatch):
    """Catches ``load_universal`` left on after the resume (a best checkpoint written after it has no
    ``latest_universal``: DeepSpeed raises at the stage's end) and a best checkpoint of the old world size loaded
    without being converted first. The attribute is DeepSpeed's own: a DeepSpeed that moves it fails here."""
    pytest.importorskip("deepspeed")
    from prove.train import universal

    engine = _Engine()
    assert engine._config.load_universal_checkpoint is True  # as the resume's config set it

    class _Trainer:
        model_wrapped = engine

    universal.UniversalResumeCallback(_Trainer()).on_train_begin(None, None, None)
    assert (
        engine._config.load_universal_checkpoint is False
    )  # the resume has loaded: an ordinary run from here
    converted = []

    def fake_convert(path):
        converted.append(Path(path).name)
        (Path(path) / "global_step2_universal").mkdir()
        (Path(path) / "latest_universal").write_text("global_step2_universal")

    monkeypatch.setattr(universal, "convert", fake_convert)
    new = _zero_checkpoint(tmp_path / "checkpoint-3", ranks=1)  # written after the resume, by this world size
    old = _zero_checkpoint(tmp_path / "checkpoint-1", ranks=2)  # written before it, never converted
    for ckpt in (new, old, old):
        with universal.loading(engine, ckpt, world_size=1, rank=0):
            engine.load()
    assert engine.loads == [False, True, True] and converted == [
        "checkpoint-1"
    ]  # converted once, then reused
    assert engine._config.load_universal_checkpoint is False  # and cleared again after
    with universal.loading(None, old, world_size=1, rank=0):  # no DeepSpeed: nothing to do
        pass
