"""``train(cfg)``: one stage of the pipeline (DESIGN §2), end to end.

0) stage distill: join the process group, generate this rank's share of the proposer's responses
   (:mod:`prove.train.distill`) and wait for the other ranks — before TrainingArguments, so that under ZeRO-3 the
   proposer loads whole, for decoding, not partitioned;
1) TrainingArguments first (under ZeRO-3 they make ``from_pretrained`` load weights partitioned);
2) tokenizer and model: from ``stage.init_from`` / ``model.name_or_path``, or a tiny Qwen2 from scratch;
3) stage mars: add ``<|mask|>`` (a spare embedding row, else resize);
4) data: load the conversations, tokenize with the chat template (``prove.data``); distill: the generated set;
5) optional LoRA; 6) train (resuming from the last checkpoint in ``output_dir``);
7) save the checkpoint contract of DESIGN §2.2: a Hugging Face directory + tokenizer + ``prove.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from prove.train.config import PeftKind, Stage, TrainConfig, config_dict, run_label

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What a finished stage left behind."""

    output_dir: Path
    global_step: int
    train_loss: float | None
    stopped_by_wall_clock: bool
    log_history: list[dict[str, Any]]
    model: Any = dataclasses.field(default=None, repr=False, compare=False)
    """The trained model as training left it (under DeepSpeed: the engine's module, still partitioned)."""


def train(cfg: TrainConfig) -> StageResult:
    """Run one stage; the logger is always closed, also when training fails."""
    from prove.train.tracking import open_logger

    tracker = open_logger(cfg)
    try:
        return _run(cfg, tracker)
    finally:
        tracker.close()


def _run(cfg: TrainConfig, tracker) -> StageResult:
    import torch
    from prove.train.collate import Collator
    from prove.train.trainer import MarsTrainer, WallClockCallback
    from transformers import Trainer
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(cfg.trainer.output_dir)
    is_distill = cfg.stage.name == Stage.distill
    if is_distill:  # 0) this rank's share of the proposer's responses (a rerun resumes)
        from prove.train import distill

        distill.init_distributed()  # first: the rendezvous never waits on a rank's generation
        if (source := tokenizer_source(cfg)) is not None:  # refuse a mismatched verifier before generating
            from prove.train.modeling import check_source, load_tokenizer

            check_source(source)
            distill.check_same_vocab(load_tokenizer(source, cfg.model.trust_remote_code), cfg.distill.proposer)
        distill.generate_responses(cfg)
        distill.wait_for_all_ranks()  # ranks finish their shards hours apart at scale
    args = training_arguments(cfg, report_to=tracker.report_to)

    # 2) tokenizer + model
    tokenizer, model, base_model = build_model_and_tokenizer(cfg, args)

    # 3) the placeholder token (also for sft, so the checkpoint decodes with block methods after mars)
    mask_id = None
    if cfg.stage.name == Stage.mars:
        from prove.train.modeling import ensure_mask_token

        mask_id = ensure_mask_token(model, tokenizer, cfg.stage.mask_token)
    elif cfg.stage.mask_token in tokenizer.get_vocab():
        mask_id = tokenizer.convert_tokens_to_ids(cfg.stage.mask_token)

    # 4) data
    if is_distill and torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank has written its shard
    # The generated set and the scratch tokenizer are written to shared storage: one process of the whole job
    # writes them (local=False); tokenizing goes to each node's own cache.
    with args.main_process_first(local=not is_distill, desc="tokenizing"):
        if is_distill:
            generated = distill.build_generated_set(cfg.distill.generated_dir)
            dataset = distill.training_rows(generated, cfg.data.max_len)
        else:
            dataset = tokenized_dataset(cfg, tokenizer)

    # 5) LoRA
    if cfg.peft.kind == PeftKind.lora:
        model = apply_lora(model, cfg, None if is_distill else mask_id)

    # 6) train
    is_mars = cfg.stage.name == Stage.mars
    collator: Any = Collator(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        block_size=cfg.stage.block_size if is_mars else 1,
    )
    if is_distill:
        collator = distill.DistillCollator(pad_token_id=tokenizer.pad_token_id)
    callbacks = []
    if cfg.trainer.max_minutes is not None:
        callbacks.append(WallClockCallback(cfg.trainer.max_minutes))
    common = dict(
        model=model, args=args, train_dataset=dataset, data_collator=collator,
        processing_class=tokenizer, callbacks=callbacks,
    )
    if is_mars:
        assert mask_id is not None
        trainer: Trainer = MarsTrainer(
            **common, mask_token_id=mask_id, block_size=cfg.stage.block_size, ar_weight=cfg.stage.ar_weight
        )
    elif is_distill:
        trainer = distill.make_trainer(cfg, **common)
    else:
        trainer = Trainer(**common)

    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if cfg.resume is True and last is None:
        raise ValueError(f"resume=true but {output_dir} has no checkpoint-* folder: drop resume=true to start fresh")
    resume_from = last if cfg.resume is not False else None
    if resume_from:
        log.info("resuming from %s", resume_from)
    result = trainer.train(resume_from_checkpoint=resume_from)

    # 7) save: HF dir + tokenizer + prove.json
    meta = prove_meta(cfg, base_model, tokenizer, mask_id)
    save_checkpoint(trainer, cfg, output_dir, meta, base_model)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank returns after rank 0 has written prove.json

    wall = next((c for c in callbacks if isinstance(c, WallClockCallback)), None)
    return StageResult(
        output_dir=output_dir,
        global_step=trainer.state.global_step,
        train_loss=getattr(result, "training_loss", None),
        stopped_by_wall_clock=bool(wall and wall.stopped_at_step is not None),
        log_history=list(trainer.state.log_history),
        model=trainer.model_wrapped,
    )


def training_arguments(cfg: TrainConfig, report_to: list[str]):
    """``TrainingArguments`` from ``cfg.trainer`` (+ ``cfg.deepspeed``); built before the model on purpose."""
    import torch
    from transformers import TrainingArguments

    t = cfg.trainer
    use_cpu = not torch.cuda.is_available()
    if cfg.deepspeed is not None and use_cpu:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    known = {f.name for f in dataclasses.fields(t)} - {"max_minutes", "extra"}
    kwargs = {name: getattr(t, name) for name in known}
    kwargs.update(t.extra)
    return TrainingArguments(
        **kwargs,
        use_cpu=use_cpu,
        deepspeed=cfg.deepspeed,
        report_to=report_to,
        run_name=run_label(cfg),
        remove_unused_columns=False,
        activation_checkpointing_kwargs={"use_reentrant": False} if t.activation_checkpointing else None,
    )


def tokenizer_source(cfg: TrainConfig) -> str | None:
    """Where the stage's tokenizer comes from (``None``: built from scratch by the tiny recipe)."""
    source = cfg.stage.init_from or cfg.model.name_or_path
    if source is None:
        return None
    return cfg.model.tokenizer if cfg.stage.init_from is None and cfg.model.tokenizer else source


def build_model_and_tokenizer(cfg: TrainConfig, args) -> tuple[Any, Any, str]:
    """``(tokenizer, model, base_model)``; ``base_model`` names what the pipeline started from (for prove.json)."""
    from prove.data.chat import ensure_chat_template
    from prove.train.modeling import check_source, load_model, load_tokenizer, scratch_model

    source = cfg.stage.init_from or cfg.model.name_or_path
    if source is not None:
        check_source(source)
        tokenizer = load_tokenizer(
            tokenizer_source(cfg),
            cfg.model.trust_remote_code,
        )
        ensure_chat_template(tokenizer, cfg.data.chat_template)  # fail before loading the weights
        model = load_model(source, cfg.model)
        base = _base_model_of(source)
    else:
        assert cfg.model.scratch is not None
        with args.main_process_first(local=False, desc="scratch tokenizer"):
            tokenizer = scratch_tokenizer(cfg)
        ensure_chat_template(tokenizer, cfg.data.chat_template)
        model = scratch_model(cfg.model.scratch, tokenizer, cfg.model, args.seed)
        base = f"scratch:qwen2-{cfg.model.scratch.layers}l-{cfg.model.scratch.hidden}h"
    return tokenizer, model, base


def _base_model_of(source: str) -> str:
    """The base model recorded by an earlier stage's prove.json, else ``source`` itself."""
    from prove.decode.checkpoint import read_prove_json

    meta = read_prove_json(source) if Path(source).is_dir() else None
    return meta.base_model if meta is not None else source


def scratch_tokenizer(cfg: TrainConfig):
    """The tiny recipe's BPE, trained on the training rows once per run and reused (every rank, every resume)."""
    from prove.data.tokenizer import build_tiny_tokenizer
    from transformers import AutoTokenizer

    arch = cfg.model.scratch
    assert arch is not None
    path = Path(cfg.run_dir) / "tokenizer"
    if (path / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(path)
    rows = load_rows(cfg)
    rows = rows.select(range(min(arch.tokenizer_rows, len(rows))))
    tok = build_tiny_tokenizer(rows, arch.vocab_size)
    tok.save_pretrained(path)
    return tok


def load_rows(cfg: TrainConfig):
    """The raw conversations (generating the synthetic task first when configured and missing)."""
    from prove.data.load import load_chat_dataset

    d = cfg.data
    if d.synthetic is not None and not Path(d.path).exists():
        from prove.data.synthetic import main as write_synthetic

        out = Path(d.path).parent
        log.info("generating the arithmetic task into %s", out)
        write_synthetic(["--out", str(out), "--n", str(d.synthetic.n), "--test-size", str(d.synthetic.test_size),
                         "--seed", str(d.synthetic.seed)])
        if not Path(d.path).exists():
            raise ValueError(f"data.path={d.path!r} is not where prove.data.synthetic writes: use <dir>/train.jsonl")
    return load_chat_dataset(d.path, d.split, name=d.name, num_rows=d.num_rows)


def tokenized_dataset(cfg: TrainConfig, tokenizer):
    from prove.data.build import build_tokenized_dataset

    dataset, report = build_tokenized_dataset(load_rows(cfg), tokenizer, cfg.data.max_len, num_proc=cfg.data.num_proc)
    log.info("data: %s", report)
    return dataset


def apply_lora(model, cfg: TrainConfig, mask_id: int | None):
    from peft import LoraConfig, get_peft_model

    p = cfg.peft
    train_tokens = [mask_id] if (p.train_mask_token and mask_id is not None) else None
    lora = LoraConfig(
        r=p.r, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=list(p.target_modules),
        task_type="CAUSAL_LM", trainable_token_indices=train_tokens,
    )
    model = get_peft_model(model, lora)
    model.print_trainable_parameters()
    return model


def prove_meta(cfg: TrainConfig, base_model: str, tokenizer, mask_id: int | None):
    from prove.decode.checkpoint import ProveMeta

    is_mars = cfg.stage.name == Stage.mars
    config = config_dict(cfg)
    extra = {"role": str(cfg.stage.role), "ar_weight": cfg.stage.ar_weight if is_mars else None,
             "init_from": cfg.stage.init_from, "peft": str(cfg.peft.kind), "training_config": config}
    if cfg.stage.name == Stage.distill:
        from prove.train.distill import meta_extra

        extra.update(meta_extra(cfg))
    return ProveMeta(
        stage=str(cfg.stage.name),
        base_model=base_model,
        block_size=cfg.stage.block_size if is_mars else None,
        mask_token=cfg.stage.mask_token if mask_id is not None else None,
        mask_token_id=mask_id,
        extra=extra,
    )


def save_checkpoint(trainer, cfg: TrainConfig, output_dir: Path, meta, base_model: str) -> None:
    """The final checkpoint (DESIGN §2.2): merged weights + tokenizer + prove.json at ``output_dir``, whatever the
    launcher. ZeRO-3 gathers the 16-bit weights. LoRA also keeps the adapter at ``output_dir/adapter``; the merged
    model is built in memory when every rank holds the whole model, and under DeepSpeed (whose module is
    partitioned under ZeRO-3) by rank 0 on the CPU from the base checkpoint + the saved adapter."""
    from prove.decode.checkpoint import write_prove_json

    if cfg.peft.kind == PeftKind.lora:
        adapter_dir = output_dir / "adapter"
        trainer.save_model(str(adapter_dir))  # under DeepSpeed: the adapter's gathered weights (every rank takes part)
        if trainer.is_world_process_zero():
            write_prove_json(adapter_dir, meta)
        if cfg.deepspeed is not None:
            _barrier()  # the adapter is on disk before rank 0 reads it back
            if trainer.is_world_process_zero():
                source = cfg.stage.init_from or cfg.model.name_or_path
                assert source is not None  # TrainConfig refuses peft=lora without a pretrained base
                log.info("merging the LoRA adapter into %s on the CPU (rank 0)", source)
                merge_adapter(source, adapter_dir, output_dir, dtype=_merge_dtype(cfg))
        elif trainer.is_world_process_zero():
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.save_pretrained(output_dir)
            trainer.processing_class.save_pretrained(output_dir)
            write_prove_json(output_dir, meta)
        return
    trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        write_prove_json(output_dir, meta)  # its training_config holds the whole resolved config


def _barrier() -> None:
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _merge_dtype(cfg: TrainConfig) -> str:
    """The merged checkpoint's dtype: the training precision (bf16/fp16 runs save 16-bit weights), else float32."""
    if cfg.trainer.bf16:
        return "bfloat16"
    return "float16" if getattr(cfg.trainer, "fp16", False) or cfg.trainer.extra.get("fp16") else "float32"


def merge_adapter(
    base: str | os.PathLike, adapter_dir: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "float32"
) -> Path:
    """Load ``base`` on the CPU, apply the LoRA adapter at ``adapter_dir`` and save the merged model (+ tokenizer,
    prove.json) to ``out_dir``. Outside any DeepSpeed context: the weights load whole, never partitioned."""
    import shutil

    import torch
    from peft import PeftModel
    from prove.train.modeling import embedding_rows
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import deepspeed as hf_ds

    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    ds_config = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    hf_ds.unset_hf_deepspeed_config()  # else from_pretrained would partition the base under ZeRO-3 (zero.Init)
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ds_config
    if embedding_rows(model) < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    out = Path(out_dir)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if (Path(adapter_dir) / "prove.json").is_file():
        shutil.copy(Path(adapter_dir) / "prove.json", out / "prove.json")
    return out
