"""The one-node path of the 32B recipe in small: ZeRO-3 with the optimizer offloaded to the CPU, 2 processes (gloo),
then a relaunch on 1 process (accumulation doubled: the same effective batch) that resumes the 2-process
checkpoint through DeepSpeed's universal format — step count, schedule and loss continue as the uninterrupted run's."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tests.train.helpers import tiny_overrides, torchrun, write_checkpoint

pytestmark = pytest.mark.slow


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
        },
    )
    out = tmp_path / f"{run}.pt"
    proc = torchrun("zero3_driver.py", [str(out), *overrides], nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out)


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
    meta = json.loads((tmp_path / "one" / "mars" / "prove.json").read_text())
    assert meta["world_size"] == 1 and meta["global_step"] == 4
