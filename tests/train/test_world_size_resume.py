"""The one-node path of the 32B recipe in small: ZeRO-3 with the optimizer offloaded to the CPU, 2 processes (gloo),
then a relaunch on 1 process (accumulation doubled: the same effective batch) that resumes the 2-process
checkpoint through DeepSpeed's universal format — step count, schedule, loss and the acceptance history continue as
the uninterrupted run's."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tests.train.helpers import tiny_overrides, torchrun, write_checkpoint


def _mars(tmp_path, run: str, sft, data, nproc: int, accumulation: int) -> dict:
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
            "trainer.save_steps": 2,
            "trainer.save_total_limit": "null",
            "trainer.lr_scheduler_type": "linear",
            "eval.rows": 8,  # acceptance scored at each save (steps 2 and 4): its history must survive the move
        },
    )
    out = tmp_path / f"{run}.pt"
    proc = torchrun("zero3_driver.py", [str(out), *overrides], nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out)


@pytest.mark.slow
def test_offloaded_zero3_resumes_on_another_world_size_through_a_universal_checkpoint(
    tmp_path, tokenizer, qwen2_factory, arithmetic_jsonl
):
    pytest.importorskip("deepspeed")
    from prove.train.universal import saved_world_size, universal_dir

    sft = write_checkpoint(
        tmp_path / "sft",
        qwen2_factory(
            len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        ),
        tokenizer,
    )
    whole = _mars(tmp_path, "two", sft, arithmetic_jsonl, nproc=2, accumulation=1)
    assert whole["world_size"] == 2 and whole["global_step"] == 4
    assert whole["cpu_offload"]  # the optimizer step ran on the CPU
    # the per-process thread count was set by prove-train, not left at torchrun's 1: the node's cores / 2 processes
    from prove.train.threads import node_cores, rank_threads

    assert whole["threads"] == rank_threads(node_cores(), 2) and whole["omp_num_threads"] == str(
        whole["threads"]
    )

    # a crash after step 2: only checkpoint-2 of the 2-process run is left; relaunch on 1 process, accumulation 2
    ckpt = tmp_path / "one" / "mars" / "checkpoint-2"
    shutil.copytree(tmp_path / "two" / "mars" / "checkpoint-2", ckpt)
    assert saved_world_size(ckpt) == 2 and universal_dir(ckpt) is None
    resumed = _mars(tmp_path, "one", sft, arithmetic_jsonl, nproc=1, accumulation=2)
    assert resumed["world_size"] == 1 and resumed["global_step"] == 4
    assert universal_dir(ckpt) is not None  # converted once, kept beside the original
    by_step = {h["step"]: h for h in whole["logs"]}
    logged = {h["step"]: h for h in resumed["logs"]}
    assert sorted(logged) == [1, 2, 3, 4]  # steps 1-2 from the checkpoint's history, 3-4 trained here
    for step in (1, 2):
        assert logged[step]["loss"] == by_step[step]["loss"]
    for step in (3, 4):
        # the schedule continues where it stopped (a restarted one would be back at its first learning rate)
        assert logged[step]["learning_rate"] == pytest.approx(by_step[step]["learning_rate"], rel=1e-6)
        # the optimizer state came along: the loss continues from the interrupted run's (other rows per step:
        # one process draws the batches another way than two)
        assert math.isfinite(logged[step]["loss"])
        assert logged[step]["loss"] == pytest.approx(by_step[step]["loss"], rel=0.1), (logged, by_step)
    # the eval history came along too: step 2's from the checkpoint, step 4's scored after the resume
    evals = {h["step"]: h for h in resumed["evals"]}
    assert sorted(evals) == [2, 4] and [h["step"] for h in whole["evals"]] == [2, 4]
    assert evals[2]["eval_tpc_k4"] == whole["evals"][0]["eval_tpc_k4"]
    assert math.isfinite(evals[4]["eval_tpc_k4"]) and evals[4]["eval_tpc_k4"] >= 1.0
    meta = json.loads((tmp_path / "one" / "mars" / "prove.json").read_text())
    assert meta["world_size"] == 1 and meta["global_step"] == 4


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
