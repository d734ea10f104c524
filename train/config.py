"""Structured configs for ``prove-train`` (DESIGN §2), registered with Hydra's ConfigStore.

``conf/train.yaml`` composes the groups below onto :class:`TrainConfig`, so an unknown key or a value
of the wrong type fails when the config is composed, not an hour into a run. ``train(cfg)`` receives
the dataclasses (``OmegaConf.to_object``), whose ``__post_init__`` checks cross-field constraints and
raises ``ValueError``s that say what to change.

Recipes (``recipes/*.yaml``) are registered as the config group ``recipe`` (package ``_global_``), so
``prove-train recipe=tiny stage=sft`` overlays a whole pipeline and a misspelt recipe fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

MASK_TOKEN = "<|mask|>"


class _Choice(str, Enum):
    def __str__(self) -> str:  # "sft", not "Stage.sft", inside interpolated strings such as output_dir
        return self.value


class Stage(_Choice):
    """A training stage (DESIGN §2): each is one Hydra run of ``prove-train``."""

    sft = "sft"
    mars = "mars"
    distill = "distill"


@dataclass
class ScratchConfig:
    """A Qwen2 model built from scratch (the tiny CPU demo, DESIGN §5) instead of loaded."""

    layers: int = 4
    """Decoder layers."""
    hidden: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 4
    """Key/value heads (grouped-query attention when fewer than ``heads``)."""
    intermediate: int = 512
    """MLP width."""
    tie_embeddings: bool = True
    """Share the input embedding and the LM head."""
    max_position_embeddings: int = 2048
    """Longest position the rotary embedding is sized for."""
    vocab_size: int = 512
    """Size of the byte-level BPE trained on the training rows (``prove.data.tokenizer.build_tiny_tokenizer``)."""
    tokenizer_rows: int = 20000
    """How many training rows the tokenizer is trained on."""


@dataclass
class ModelConfig:
    """The model a stage starts from."""

    name_or_path: str | None = None
    """Hub id or local directory of the base model; ``None`` builds ``scratch`` instead."""
    tokenizer: str | None = None
    """Tokenizer hub id or directory when it differs from ``name_or_path``."""
    scratch: ScratchConfig | None = None
    """Architecture of a from-scratch model (used when ``name_or_path`` is ``None``)."""
    dtype: str = "auto"
    """Weights dtype when loading: ``auto`` (fp32 on CPU, the checkpoint's dtype on GPU), ``float32``, ``bfloat16``, ``float16``."""
    attn_implementation: str = "sdpa"
    """``eager``, ``sdpa``, ``flex_attention`` (MARS then uses a sparse BlockMask) or ``flash_attention_2`` (SFT only)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``."""

    def __post_init__(self) -> None:
        if self.name_or_path is None and self.scratch is None:
            raise ValueError("set model.name_or_path=<hub id or dir>, or pick a from-scratch model (model=tiny)")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype={self.dtype!r}: use auto, float32, bfloat16 or float16")


@dataclass
class SyntheticConfig:
    """Generate the arithmetic demo task (``prove.data.synthetic``) at ``data.path`` when it is missing."""

    n: int = 20000
    """Training rows."""
    test_size: int = 500
    """Held-out prompts written next to it as ``test.jsonl``."""
    seed: int = 0
    """Generator seed."""


@dataclass
class DataConfig:
    """Training conversations (Dolci ``messages`` schema; DESIGN §2)."""

    path: str = MISSING
    """Hub id, JSONL/parquet file or folder, or ``save_to_disk`` folder."""
    name: str | None = None
    """The hub dataset's config name."""
    split: str = "train"
    """Hub split."""
    num_rows: int | None = None
    """Use only the first N rows (quick runs)."""
    max_len: int = 512
    """Longest tokenized example; longer ones are right-truncated, rows whose prompt alone is longer are dropped."""
    num_proc: int = 1
    """Tokenization worker processes."""
    chat_template: str | None = None
    """``None`` keeps the tokenizer's template; ``chatml`` or a Jinja string replaces it."""
    synthetic: SyntheticConfig | None = None
    """Generate the arithmetic demo task into ``path``'s folder if ``path`` does not exist."""


@dataclass
class StageConfig:
    """What the stage trains (DESIGN §2, §2.1)."""

    name: Stage = Stage.sft
    """``sft``, ``mars`` (block training) or ``distill`` (verifier; not yet implemented)."""
    init_from: str | None = None
    """Checkpoint the stage starts from instead of ``model.name_or_path`` (mars: the sft stage's output)."""
    block_size: int = 16
    """K, the number of placeholders filled per forward pass (mars)."""
    ar_weight: float = 1.0
    """Weight of the clean-stream (AR) CE added to the noisy-stream CE (mars)."""
    mask_token: str = MASK_TOKEN
    """The placeholder token added to the tokenizer (mars)."""


@dataclass
class TrainerConfig:
    """``transformers.TrainingArguments`` values (plus the wall-clock cap); ``extra`` passes any other argument."""

    output_dir: str = MISSING
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-6
    num_train_epochs: float = 1.0
    max_steps: int = -1
    """Stop after this many optimizer steps (-1: run ``num_train_epochs``); the LR schedule ends here."""
    lr_scheduler_type: str = "cosine"
    warmup_steps: float = 0.03
    """Steps, or a fraction of the run when < 1."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    bf16: bool = False
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (transformers' new name for gradient checkpointing)."""
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int | None = 2
    seed: int = 42
    dataloader_num_workers: int = 0
    max_minutes: float | None = None
    """Stop (and save) once training has run this many minutes; the cap applies alongside ``max_steps``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other ``TrainingArguments`` field, e.g. ``+trainer.extra.eval_steps=100``."""


class PeftKind(_Choice):
    none = "none"
    lora = "lora"


@dataclass
class PeftConfig:
    """Parameter-efficient fine-tuning (``peft``): ``none`` or LoRA."""

    kind: PeftKind = PeftKind.none
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    train_mask_token: bool = True
    """Train the ``<|mask|>`` embedding row (``trainable_token_indices``) — MARS needs it."""
    merge: bool = True
    """Also save the merged model at ``output_dir`` (the adapter always goes to ``output_dir/adapter``)."""


class LoggerKind(_Choice):
    none = "none"
    wandb = "wandb"


@dataclass
class LoggerConfig:
    """Experiment tracking; ``WANDB_MODE=offline`` keeps wandb local."""

    kind: LoggerKind = LoggerKind.none
    project: str = "prove"
    name: str | None = None
    group: str | None = None
    entity: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    """One ``prove-train`` run: one stage of one pipeline."""

    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    stage: StageConfig = MISSING
    trainer: TrainerConfig = MISSING
    deepspeed: dict[str, Any] | None = None
    """A DeepSpeed config (JSON-able; ``auto`` where TrainingArguments owns the value), or ``None``."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    run_name: str = "default"
    """Names the run: outputs go to ``runs/<run_name>/<stage>``."""
    run_dir: str = "runs/${run_name}"
    output_dir: str = "${run_dir}/${stage.name}"
    block_size: int = 16
    """K (top-level knob, interpolated into ``stage.block_size``)."""
    max_len: int = 512
    """Longest training example (interpolated into ``data.max_len``)."""
    lr: float = 5e-6
    """Peak learning rate (interpolated into ``trainer.learning_rate``)."""
    epochs: float = 1.0
    """Epochs (interpolated into ``trainer.num_train_epochs``)."""
    max_steps: int = -1
    """Optimizer steps, -1 for whole epochs (interpolated into ``trainer.max_steps``)."""
    resume: bool | None = None
    """``True``: resume from the last checkpoint in ``output_dir`` (error if none); ``None``: resume if one exists; ``False``: start over."""
    stages: dict[str, Any] = field(default_factory=dict)
    """Per-stage knob table for recipes: ``lr: ${stages.${stage.name}.lr}``."""

    def __post_init__(self) -> None:
        k, max_len = self.stage.block_size, self.data.max_len
        if k < 1:
            raise ValueError(f"block_size={k}: K must be ≥ 1 (MARS uses 4–16); pass block_size=<K>")
        if self.stage.name == Stage.mars and k > max_len:
            raise ValueError(f"block_size={k} exceeds max_len={max_len}: lower block_size or raise max_len")
        if max_len < 2:
            raise ValueError(f"max_len={max_len}: an example needs at least a prompt and one response token")
        if self.stage.name == Stage.distill:
            raise ValueError("stage=distill is not implemented yet: run stage=sft or stage=mars")


def register_configs() -> None:
    """Register the schema and the recipes with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, node in recipe_nodes().items():
        cs.store(group="recipe", name=name, node=node, package="_global_")


def recipe_nodes() -> dict[str, Any]:
    """Every ``recipes/*.yaml`` (shipped as ``prove.recipes``), loaded, by name."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    out = {}
    for entry in sorted(files("prove.recipes").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            out[entry.name.removesuffix(".yaml")] = OmegaConf.create(entry.read_text())
    return out
