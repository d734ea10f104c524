"""A simulated two-node run through the Makefile's launch: `make train-proposer NNODES=2 GPUS_PER_NODE=1`
started twice on this machine (NODE_RANK 0 and 1, one torchrun rendezvous on localhost), DeepSpeed ZeRO-3 over
gloo, a few steps of sft then mars on a tiny model; both stages' outputs load and decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.helpers import free_port, tiny_overrides

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


def test_two_nodes_sft_then_mars_zero3_checkpoints_decode(tmp_path, arithmetic_jsonl):
    pytest.importorskip("deepspeed")
    if not (VENV / "bin" / "torchrun").exists():
        pytest.skip("needs the venv's torchrun (run under .venv/bin/python)")
    runs = tmp_path / "runs"  # the "shared file system" of both nodes
    args = tiny_overrides(
        runs,
        arithmetic_jsonl,
        deepspeed="zero3",
        max_steps=3,
        **{"trainer.per_device_train_batch_size": 4, "trainer.save_steps": 2, "trainer.max_minutes": "null"},
    )
    port = free_port()
    procs, logs = [], []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        env.update(
            OMP_NUM_THREADS="1", HF_DATASETS_CACHE=str(tmp_path / f"node{rank}-cache")
        )  # each node's disk
        # DeepSpeed JIT-builds its CPU shared-memory comm op on first use (minutes); keep the build next to the
        # venv it was built for, so venvs at other paths sharing ~/.cache/torch_extensions do not rebuild it in turn.
        env.setdefault("TORCH_EXTENSIONS_DIR", str(VENV / "torch_extensions"))
        log = open(tmp_path / f"node{rank}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        cmd = [
            "make",
            "--no-print-directory",
            "-o",
            f"{VENV}/.prove-installed",
            "train-proposer",
            f"VENV={VENV}",
            "RECIPE=tiny",
            "NNODES=2",
            "GPUS_PER_NODE=1",
            f"NODE_RANK={rank}",
            "MASTER_ADDR=127.0.0.1",
            f"MASTER_PORT={port}",
            "ARGS=" + " ".join(args),
        ]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 840  # ~1 min on an idle 2-core CPU; minutes more on a busy one
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    out = [(tmp_path / f"node{r}.log").read_text() for r in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], out[0][-4000:] + "\n----- node 1 -----\n" + out[1][-4000:]
    assert "--nnodes 2 --nproc_per_node 1 --node_rank 1 --master_addr 127.0.0.1" in out[1]

    from prove.decode import Decoder
    from transformers import AutoModelForCausalLM

    prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    for stage in ("sft", "mars"):
        d = runs / stage
        meta = json.loads((d / "prove.json").read_text())
        assert meta["stage"] == stage
        cfg = meta["training_config"]
        assert cfg["deepspeed"]["zero_optimization"]["stage"] == 3 and cfg["trainer"]["max_steps"] == 3
        # resumable checkpoints were written by both ranks (the ZeRO-3 optimizer shards of rank 0 and rank 1)
        (ckpt,) = d.glob("checkpoint-*")  # the recipe keeps the newest only
        shards = sorted(p.name for p in ckpt.rglob("*optim_states.pt"))
        assert len(shards) == 2, sorted(p.name for p in ckpt.rglob("*"))
        AutoModelForCausalLM.from_pretrained(d)  # gathered 16-bit weights: an ordinary HF directory
        ar = Decoder(str(d), method="ar").generate(prompt, max_new_tokens=12)
        assert len(ar.token_ids) >= 1
        if stage == "mars":
            assert meta["block_size"] == 4
            block = Decoder(str(d), method="prove-lossless").generate(prompt, max_new_tokens=12)
            assert block.token_ids == ar.token_ids  # lossless: the block checkpoint decodes exactly like AR
