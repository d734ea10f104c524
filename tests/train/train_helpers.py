"""Helpers for prove.train tests: the real composed config, shrunk to a tiny model."""

from __future__ import annotations

from pathlib import Path


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
