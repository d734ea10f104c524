"""The end of a stage: the checkpoint contract of docs/design.md §2.2 — a Hugging Face directory (merged weights
when LoRA trained an adapter) + tokenizer + ``prove.json`` — written whatever the launcher."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, cast

import torch
from peft import PeftModel
from prove.common.checkpoint import ProveMeta, read_prove_json, write_prove_json
from prove.data.loading import load_model
from prove.train.config import PeftKind, TrainConfig, config_dict
from prove.train.modeling import embedding_rows, start_source
from prove.train.stages import StageUnit
from transformers import AutoTokenizer
from transformers.integrations import deepspeed as hf_ds

log = logging.getLogger(__name__)


def prove_meta(
    cfg: TrainConfig,
    unit: StageUnit,
    base_model: str,
    mask_id: int | None,
    *,
    stopped_early: dict[str, Any] | None = None,
    global_step: int | None = None,
    evaluation: dict[str, Any] | None = None,
) -> ProveMeta:
    """The checkpoint's prove.json: the common fields, and the stage unit's block size and extra entries.

    ``stopped_early``: the wall-clock cap's record when it ended training before its last step (None: every
    step ran), so a checkpoint says itself that it is under-trained. ``evaluation``: stage mars's held-out
    acceptance (``MarsTrainer.eval_record``), None without an eval set."""
    extra = {
        "role": str(cfg.stage.role),
        "stopped_early": stopped_early,
        "eval": evaluation,
        "ar_weight": None,
        "depth_decay": None,
        "init_from": cfg.stage.init_from,
        "peft": str(cfg.peft.kind),
        "training_config": config_dict(cfg),
        "world_size": int(
            os.environ.get("WORLD_SIZE", "1")
        ),  # with the micro-batch × accumulation: the batch
        "global_step": global_step,
    }
    extra.update(unit.meta_extra(cfg))
    return ProveMeta(
        stage=str(cfg.stage.name),
        base_model=base_model,
        block_size=unit.block_size(cfg),
        mask_token=cfg.stage.mask_token if mask_id is not None else None,
        mask_token_id=mask_id,
        extra=extra,
    )


def save_checkpoint(trainer: Any, cfg: TrainConfig, output_dir: Path, meta: ProveMeta) -> None:
    """The final checkpoint (docs/design.md §2.2): merged weights + tokenizer + prove.json at ``output_dir``, whatever the
    launcher. ZeRO-3 gathers the 16-bit weights. LoRA also keeps the adapter at ``output_dir/adapter``; the merged
    model is built in memory when every rank holds the whole model, and under DeepSpeed (whose module is
    partitioned under ZeRO-3) by rank 0 on the CPU from the base checkpoint + the saved adapter."""
    if cfg.peft.kind == PeftKind.lora:
        adapter_dir = output_dir / "adapter"
        trainer.save_model(
            str(adapter_dir)
        )  # under DeepSpeed: the adapter's gathered weights (every rank takes part)
        if trainer.is_world_process_zero():
            write_prove_json(adapter_dir, meta)
        if cfg.deepspeed is not None:
            barrier()  # the adapter is on disk before rank 0 reads it back
            if trainer.is_world_process_zero():
                source = start_source(cfg)
                assert source is not None  # TrainConfig refuses peft=lora without a pretrained base
                log.info("merging the LoRA adapter into %s on the CPU (rank 0)", source)
                merge_adapter(
                    source, adapter_dir, output_dir, dtype=_merge_dtype(cfg), num_layers=cfg.model.num_layers
                )
        elif trainer.is_world_process_zero():
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.save_pretrained(output_dir)
            trainer.processing_class.save_pretrained(output_dir)
            write_prove_json(output_dir, meta)
        return
    trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        write_prove_json(output_dir, meta)  # its training_config holds the whole resolved config


def barrier() -> None:
    """Wait for every rank (a no-op without a process group)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _merge_dtype(cfg: TrainConfig) -> str:
    """The merged checkpoint's dtype: the training precision (bf16/fp16 runs save 16-bit weights), else float32."""
    if cfg.trainer.bf16:
        return "bfloat16"
    return "float16" if cfg.trainer.extra.get("fp16") else "float32"


def merge_adapter(
    base: str | os.PathLike,
    adapter_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    dtype: str = "float32",
    num_layers: int | None = None,
) -> Path:
    """Load ``base`` on the CPU (cut to ``num_layers`` as the stage cut it), apply the LoRA adapter at
    ``adapter_dir`` and save the merged model (+ tokenizer, prove.json) to ``out_dir``. Outside any DeepSpeed
    context: the weights load whole, never partitioned."""
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    ds_config = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    hf_ds.unset_hf_deepspeed_config()  # else from_pretrained would partition the base under ZeRO-3 (zero.Init)
    try:
        model = load_model(str(base), dtype, num_layers=num_layers)
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ds_config
    if embedding_rows(model) < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    out = Path(out_dir)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if (Path(adapter_dir) / "prove.json").is_file():
        # written anew, not copied: a block checkpoint's config.json takes its mask id too (vLLM reads it there)
        write_prove_json(out, cast(ProveMeta, read_prove_json(adapter_dir)))
    return out
