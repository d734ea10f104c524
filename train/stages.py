"""The training stages as units behind one interface, and their registry (as :mod:`prove.decode.methods` is for
decoding methods).

A :class:`StageUnit` says what its stage differs in; :func:`prove.train.pipeline.train` runs the same steps for
every stage and asks the unit at each:

- ``prepare``: work before ``TrainingArguments`` (distill: generate the proposer's responses);
- ``untrained_output``: the output of a stage that ends after ``prepare`` (distill with ``distill.train=false``);
- ``adds_mask_token``: add ``<|mask|>`` to the tokenizer (mars), else only look it up;
- ``lora_trains_mask_token``: with LoRA, train the placeholder's embedding row (not for distill's verifier);
- ``dataset`` / ``collator`` / ``trainer``: what the Trainer runs on and with;
- ``block_size`` / ``meta_extra``: the stage's fields of the checkpoint's ``prove.json`` (docs/design.md §2.2).

    stage_unit(Stage.mars).trainer(cfg, mask_id, **common)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from prove.train import distill
from prove.train.collate import Collator, DistillCollator
from prove.train.config import Stage, TrainConfig
from prove.train.modeling import check_source, load_tokenizer, tokenizer_source
from prove.train.rows import tokenized_dataset
from prove.train.trainer import DistillTrainer, EvalCallback, MarsTrainer
from transformers import Trainer


class StageUnit:
    """Stage sft's behaviour, which the other stages override where they differ."""

    name: ClassVar[Stage] = Stage.sft
    adds_mask_token: ClassVar[bool] = False
    """Add ``stage.mask_token`` to the tokenizer (else its id is recorded only when the tokenizer has it)."""
    lora_trains_mask_token: ClassVar[bool] = True
    """With ``peft=lora``: train the placeholder's embedding row (``peft.train_mask_token``) when it exists."""

    def prepare(self, cfg: TrainConfig) -> None:
        """Work before ``TrainingArguments`` exist (they make ZeRO-3 load models partitioned)."""

    def untrained_output(self, cfg: TrainConfig) -> Path | None:
        """The stage's output when it ends after ``prepare`` with nothing to train; ``None``: it trains."""
        return None

    def dataset(self, cfg: TrainConfig, tokenizer: Any, args: Any) -> Any:
        """The tokenized training rows, built once by each node's first process (:mod:`prove.train.rows`: the
        others wait on its file, outside any collective); without ``data.cache_dir`` that process tokenizes
        first and the others then read ``datasets``' cache."""
        if cfg.data.cache_dir is not None:
            return tokenized_dataset(cfg, tokenizer)
        with args.main_process_first(local=True, desc="tokenizing"):
            return tokenized_dataset(cfg, tokenizer)

    def split_eval(self, cfg: TrainConfig, dataset: Any) -> tuple[Any, Any | None]:
        """``(training rows, held-out eval rows or None)``; only stage mars scores an eval set."""
        return dataset, None

    def eval_record(self, trainer: Trainer) -> dict[str, Any] | None:
        """prove.json's ``eval`` entry (None: the stage scored no eval set)."""
        return None

    def collator(self, cfg: TrainConfig, tokenizer: Any) -> Any:
        return Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)

    def trainer(self, cfg: TrainConfig, mask_id: int | None, **common: Any) -> Trainer:
        """The Trainer over ``common`` (model, args, train_dataset, data_collator, processing_class, callbacks)."""
        return Trainer(**common)

    def block_size(self, cfg: TrainConfig) -> int | None:
        """K recorded in prove.json (``None``: the checkpoint is not a block proposer)."""
        return None

    def meta_extra(self, cfg: TrainConfig) -> dict[str, Any]:
        """Stage-specific entries of prove.json's ``extra``."""
        return {}


class SftStage(StageUnit):
    """Ordinary causal-LM SFT: CE on the final assistant turn."""


class MarsStage(StageUnit):
    """MARS block training (docs/design.md §2.1): K placeholders per block, ``[noisy | clean]`` input."""

    name = Stage.mars
    adds_mask_token = True

    def collator(self, cfg: TrainConfig, tokenizer: Any) -> Any:
        return Collator(
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            block_size=cfg.stage.block_size,
        )

    def split_eval(self, cfg: TrainConfig, dataset: Any) -> tuple[Any, Any | None]:
        """``eval.rows`` rows held out of the stage's data (a sample seeded by ``trainer.seed``: the same split on
        resume); a ``ValueError`` naming the fix when the data cannot spare them."""
        rows = cfg.eval.resolve_rows(len(dataset))
        if rows == 0:
            return dataset, None
        split = dataset.train_test_split(test_size=rows, seed=cfg.trainer.seed, shuffle=True)
        return split["train"], split["test"]

    def eval_record(self, trainer: Trainer) -> dict[str, Any] | None:
        assert isinstance(trainer, MarsTrainer)
        return trainer.eval_record()

    def trainer(self, cfg: TrainConfig, mask_id: int | None, **common: Any) -> Trainer:
        assert mask_id is not None, "stage mars adds the mask token before building its trainer"
        if common.get("eval_dataset") is not None:
            every = cfg.eval.steps or cfg.trainer.save_steps
            common["callbacks"] = [*common.get("callbacks", []), EvalCallback(every)]
        return MarsTrainer(
            **common,
            mask_token_id=mask_id,
            block_size=cfg.stage.block_size,
            ar_weight=cfg.stage.ar_weight,
            ce_chunk_rows=cfg.stage.ce_chunk_rows,
            depth_decay=cfg.stage.depth_decay,
            attention=cfg.stage.attention,
            eval_batch_size=cfg.eval.batch_size,
            eval_tau=cfg.eval.tau,
        )

    def block_size(self, cfg: TrainConfig) -> int | None:
        return cfg.stage.block_size

    def meta_extra(self, cfg: TrainConfig) -> dict[str, Any]:
        return {"ar_weight": cfg.stage.ar_weight, "depth_decay": cfg.stage.depth_decay}


class DistillStage(StageUnit):
    """Verifier distillation (docs/design.md §2.3): generate the proposer's responses, then CE + top-k KL."""

    name = Stage.distill
    lora_trains_mask_token = False

    def prepare(self, cfg: TrainConfig) -> None:
        """This rank's share of the proposer's responses (a rerun resumes), then wait for every rank; with
        ``distill.train=false`` the first rank then assembles the set (no training step will)."""
        rank, _ = distill.init_distributed()  # first: the rendezvous never waits on a rank's generation
        source = tokenizer_source(cfg) if cfg.distill.train else None
        if source is not None:  # refuse a mismatched verifier before generating
            check_source(source)
            distill.check_same_vocab(
                load_tokenizer(source, cfg.model.trust_remote_code), cfg.distill.proposer
            )
        distill.generate_responses(cfg)
        distill.wait_for_all_ranks()  # ranks finish their shards hours apart at scale
        if not cfg.distill.train:
            if rank == 0:
                distill.build_generated_set(cfg.distill.generated_dir)
            distill.wait_for_all_ranks()

    def untrained_output(self, cfg: TrainConfig) -> Path | None:
        return None if cfg.distill.train else Path(cfg.distill.generated_dir) / "dataset"

    def dataset(self, cfg: TrainConfig, tokenizer: Any, args: Any) -> Any:
        """The generated set, assembled by one process of the whole job (it is on shared storage); every shard
        is written (``prepare`` waited for all ranks)."""
        with args.main_process_first(local=False, desc="tokenizing"):
            generated = distill.build_generated_set(cfg.distill.generated_dir)
            return distill.training_rows(generated, cfg.data.max_len)

    def collator(self, cfg: TrainConfig, tokenizer: Any) -> Any:
        return DistillCollator(pad_token_id=tokenizer.pad_token_id)

    def trainer(self, cfg: TrainConfig, mask_id: int | None, **common: Any) -> Trainer:
        return DistillTrainer(**common, kl_weight=cfg.distill.kl_weight)

    def meta_extra(self, cfg: TrainConfig) -> dict[str, Any]:
        return distill.meta_extra(cfg)


STAGES: dict[Stage, StageUnit] = {unit.name: unit for unit in (SftStage(), MarsStage(), DistillStage())}
"""Every stage, by name."""


def stage_unit(name: Stage | str) -> StageUnit:
    """The unit of stage ``name``; a clear error for an unknown one."""
    try:
        return STAGES[Stage(name)]
    except ValueError:
        raise ValueError(f"unknown stage {name!r}: use one of {[str(s) for s in STAGES]}") from None
