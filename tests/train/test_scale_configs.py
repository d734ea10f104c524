"""What makes the 32B recipe fit and resume, read from the composed config, plus the trainer settings behind it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prove.train.config import Stage

from tests.train.helpers import train_config

ROOT = Path(__file__).resolve().parents[2]
GPUS = 8  # the recipe as written: one node of 8 GPUs


@pytest.mark.parametrize("stage", ["sft", "mars", "distill"])
def test_32b_recipe_composes_with_what_makes_it_fit(stage):
    cfg = train_config(["recipe=qwen2.5-32b", f"stage={stage}"])
    assert cfg.stage.name == Stage(stage)
    if stage == "distill":  # its values are asserted by the distillation tests
        return
    t, ds = cfg.trainer, cfg.deepspeed
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-32B-Instruct" and cfg.model.dtype == "bfloat16"
    assert t.bf16 and t.activation_checkpointing
    assert ds["bf16"]["enabled"] == "auto" and ds["zero_optimization"]["stage"] == 3  # bf16 from the trainer
    assert (
        ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    )  # final dir loads as is
    # one node: the optimizer (fp32 master + Adam + fp32 grads, 524 GB) in host memory, the weights on the GPUs
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in ds["zero_optimization"]
    assert _deepspeed_optimizer(ds).__name__ == "DeepSpeedCPUAdam"
    # effective batch 384 of the MARS reference
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps * GPUS == 384
    assert t.per_device_train_batch_size == 12 and t.gradient_accumulation_steps == 4
    # resumable checkpoints at a ~1–2.5 h interval, only the newest kept (each is ~0.5 TB)
    assert t.save_only_model is False and t.save_steps == 1000 and t.save_total_limit == 1
    assert cfg.data.max_len == 512 and cfg.data.max_len % cfg.stage.block_size == 0
    assert cfg.data.num_proc == 16 and cfg.data.cache_dir == "runs/qwen2.5-32b/tokenized"  # tokenized once
    assert cfg.stage.block_size == 16 and t.learning_rate == 5e-6 and t.warmup_steps == 0.03
    assert cfg.output_dir == f"runs/qwen2.5-32b/{stage}"


def _node_rows() -> dict[int, list[str]]:
    """The recipe header's overrides per node count (``#   2 nodes  NODES2="..."``)."""
    text = (ROOT / "recipes" / "qwen2.5-32b.yaml").read_text()
    return {
        int(m.group(1)): m.group(2).split()
        for m in re.finditer(r'^#\s+(\d+) nodes\s+NODES\1="([^"]*)"', text, flags=re.M)
    }


def test_every_node_count_keeps_the_batch_and_runs_without_offload():
    rows = _node_rows()
    assert sorted(rows) == [2, 4, 8]
    for nodes, overrides in rows.items():
        cfg = train_config(["recipe=qwen2.5-32b", "stage=mars", *overrides])
        t, zero = cfg.trainer, cfg.deepspeed["zero_optimization"]
        assert t.per_device_train_batch_size * t.gradient_accumulation_steps * nodes * 8 == 384, nodes
        assert "offload_optimizer" not in zero, nodes  # 2+ nodes hold the optimizer state on the GPUs
        # ZeRO-3 shards 524 GB / GPUs + 4 GB in flight + 3 GB an example + 4 GB slack: under 80 GB
        assert 524 / (nodes * 8) + 4 + 3 * t.per_device_train_batch_size + 4 < 70, nodes


def test_prove_train_cfg_job_composes_the_32b_recipe(stage="mars"):
    """The runbook's check before a launch (docs/training.md, step 3): `prove-train --cfg job recipe=qwen2.5-32b
    stage=<stage>` (the other stages compose in-process above, through the same Hydra compose)."""
    proc = subprocess.run(
        [sys.executable, "-m", "prove.train.cli", "--cfg", "job", "recipe=qwen2.5-32b", f"stage={stage}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = yaml.safe_load(proc.stdout)
    assert job["stage"]["name"] == stage and job["run_name"] == "qwen2.5-32b"
    assert job["trainer"]["bf16"] is True and job["trainer"]["activation_checkpointing"] is True
    assert job["trainer"]["save_only_model"] is False and job["trainer"]["save_steps"] == 1000


def test_save_only_model_is_a_trainer_setting(tmp_path, arithmetic_jsonl):
    from prove.train.pipeline import training_arguments

    from tests.train.helpers import tiny_overrides

    assert train_config([]).trainer.save_only_model is False  # resumable by default
    for value in (True, False):
        cfg = train_config(tiny_overrides(tmp_path, arithmetic_jsonl, **{"trainer.save_only_model": value}))
        assert training_arguments(cfg, report_to=[]).save_only_model is value


def test_activation_checkpointing_reaches_training_arguments_under_either_name(tmp_path, arithmetic_jsonl):
    """transformers 5.24 names it activation_checkpointing, the 5.19 that vLLM pins gradient_checkpointing: the
    setting reaches TrainingArguments (non-reentrant) whichever this environment has."""
    from prove.train.pipeline import training_arguments

    from tests.train.helpers import tiny_overrides

    for value in (True, False):
        cfg = train_config(
            tiny_overrides(tmp_path, arithmetic_jsonl, **{"trainer.activation_checkpointing": value})
        )
        args = training_arguments(cfg, report_to=[])
        name = (
            "activation_checkpointing"
            if hasattr(args, "activation_checkpointing_kwargs")
            else "gradient_checkpointing"
        )
        assert getattr(args, name) is value
        assert getattr(args, f"{name}_kwargs") == ({"use_reentrant": False} if value else None)


def _deepspeed_optimizer(ds: dict):
    """The optimizer class DeepSpeed's engine picks for this config (its own selection code, no engine built)."""
    engine = pytest.importorskip("deepspeed.runtime.engine")
    zero = ds["zero_optimization"]
    fake = SimpleNamespace(
        zero_use_cpu_optimizer=lambda: zero.get("offload_optimizer", {}).get("device") in ("cpu", "nvme"),
        zenflow=False,
        bf16_optimizer_states=lambda: False,
    )
    params = dict(ds["optimizer"]["params"])
    cls, _ = engine.DeepSpeedEngine.get_optimizer_configuration(fake, params, True)
    return cls


def test_zero3_offload_uses_deepspeeds_cpu_adam():
    off = train_config(["deepspeed=zero3_offload"]).deepspeed
    assert off["optimizer"]["params"]["torch_adam"] is False
    assert off["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert _deepspeed_optimizer(off).__name__ == "DeepSpeedCPUAdam"
    # plain ZeRO-3 keeps torch's AdamW (no fused-Adam build on CPU machines)
    import torch

    assert _deepspeed_optimizer(train_config(["deepspeed=zero3"]).deepspeed) is torch.optim.AdamW


@pytest.mark.parametrize(
    "max_len,k,fix",
    [(100, 16, "use max_len=96 or max_len=112"), (10, 16, None), (513, 16, "use max_len=512 or max_len=528")],
)
def test_mars_max_len_must_be_a_multiple_of_k(max_len, k, fix):
    overrides = ["stage=mars", f"max_len={max_len}", f"block_size={k}"]
    if fix is None:  # K above max_len: the existing, more specific error
        with pytest.raises(ValueError, match="exceeds max_len"):
            train_config(overrides)
        return
    with pytest.raises(ValueError, match=f"max_len={max_len} is not a multiple of block_size={k}.*{fix}"):
        train_config(overrides)
    train_config(["stage=sft", f"max_len={max_len}", f"block_size={k}"])  # sft pads nothing to K
    train_config(["stage=mars", f"max_len={max_len // k * k}", f"block_size={k}"])


def test_truncated_rows_would_get_eos_labels_inside_the_answer():
    """Why the check exists: a row right-truncated at max_len (no EOS of its own) padded up to K."""
    from prove.train.collate import Collator

    row = {"input_ids": list(range(10, 20)), "labels": [-100] * 4 + list(range(14, 20))}  # truncated at 10
    batch = Collator(pad_token_id=0, eos_token_id=2, block_size=4)([row])
    assert batch["labels"][0, 10:].tolist() == [2, 2]  # EOS targets right after a cut-off answer


def test_recipe_header_states_the_sizing():
    text = (ROOT / "recipes" / "qwen2.5-32b.yaml").read_text()
    for needle in (
        "Memory per GPU",
        "micro-batch 12 × accumulation 4 × 8 GPUs = 384",
        "host memory per node",
        "Wall time",
        "every 1000 steps",
    ):
        assert needle in text
