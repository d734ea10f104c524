"""Helpers for prove.train tests: the real composed config shrunk to a tiny model, a checkpoint writer, and
torchrun for the multi-process drivers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from prove.common.checkpoint import ProveMeta, write_prove_json
from prove.data.loading import MASK_TOKEN

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def compose_train(overrides: list[str]):
    """``conf/train.yaml`` composed the way ``prove-train`` composes it (recipes registered), as a DictConfig."""
    import prove.train.cli  # noqa: F401 - registers the schema and the recipes
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="prove.conf", version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def train_config(overrides: list[str]):
    from prove.train.cli import to_config

    return to_config(compose_train(overrides))


def tiny_overrides(run_dir: Path, data: Path, **kw) -> list[str]:
    """A 2-layer, hidden-32 from-scratch model, batch 8, loss logged every step."""
    base = {
        "run_dir": str(run_dir),
        "data.path": str(data),
        "data.synthetic": "null",
        "model.scratch.layers": 2,
        "model.scratch.hidden": 32,
        "model.scratch.heads": 2,
        "model.scratch.kv_heads": 2,
        "model.scratch.intermediate": 64,
        "model.scratch.vocab_size": 300,
        "model.scratch.tokenizer_rows": 256,
        "model.attn_implementation": "eager",
        "max_len": 128,
        "block_size": 4,
        "epochs": 50,
        "max_steps": 8,
        "lr": 3e-3,
        "trainer.per_device_train_batch_size": 8,
        "trainer.logging_steps": 1,
        "trainer.save_steps": 1000,
        "trainer.warmup_steps": 0,
        "trainer.seed": 0,
    }
    if "model" in kw:  # another model group: no scratch architecture to shrink
        base = {k: v for k, v in base.items() if not k.startswith("model.scratch.")}
    base.update(kw)
    return [f"{k}={v}" for k, v in base.items()]


def losses(log_history: list[dict]) -> list[float]:
    return [h["loss"] for h in log_history if "loss" in h]


def write_checkpoint(
    path: Path, model: Any, tokenizer: Any, block_size: int | None = None, base_model: str = "tiny-random"
) -> Path:
    """A checkpoint directory as training leaves it: weights + tokenizer, and with ``block_size`` a MARS
    proposer's prove.json (K and the tokenizer's ``<|mask|>`` id)."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if block_size is not None:
        write_prove_json(
            path,
            ProveMeta(
                stage="mars",
                base_model=base_model,
                block_size=block_size,
                mask_token=MASK_TOKEN,
                mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN),
            ),
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(driver: str, args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node <nproc> tests/train/<driver> <args>`` on free ports; the drivers import this
    module."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        str(HERE / driver),
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
