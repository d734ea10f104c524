"""The model and tokenizer a stage starts from (a checkpoint through :mod:`prove.data.loading`, or a tiny Qwen2
and BPE built from scratch), and MARS's ``<|mask|>`` token."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from peft import LoraConfig, get_peft_model
from prove.common.checkpoint import read_prove_json
from prove.data import loading
from prove.data.chat import ensure_chat_template
from prove.data.loading import load_tokenizer
from prove.data.tokenizer import build_tiny_tokenizer

# re-exported: they moved to prove.train.mars_step (the GPU check runs them without peft)
from prove.train.mars_step import target_embedding as target_embedding
from prove.train.mars_step import target_head as target_head
from prove.train.rows import load_rows
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

if TYPE_CHECKING:
    from prove.train.config import ModelConfig, ScratchConfig, TrainConfig

log = logging.getLogger(__name__)


def check_source(source: str) -> None:
    """A local-looking path that does not exist is a user error, not a hub lookup."""
    loading.check_source(
        source,
        "for stage=mars run stage=sft first (it writes this directory), "
        "or set stage.init_from=<checkpoint dir> / model.name_or_path=<hub id or dir>",
    )


def load_model(source: str, cfg: ModelConfig):
    """``from_pretrained`` (under ZeRO-3 the weights load partitioned when TrainingArguments exist first), cut to
    ``cfg.num_layers`` decoder layers when set."""
    return loading.load_model(
        source,
        cfg.dtype,
        attn_implementation=cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code,
        num_layers=cfg.num_layers,
    )


def scratch_model(arch: ScratchConfig, tokenizer: Any, cfg: ModelConfig, seed: int):
    """A randomly initialised Qwen2 sized by ``arch`` for ``tokenizer`` (docs/design.md §5)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        intermediate_size=arch.intermediate,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        config, dtype=loading.torch_dtype(cfg.dtype), attn_implementation=cfg.attn_implementation
    )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def start_source(cfg: TrainConfig) -> str | None:
    """What the stage starts from: ``stage.init_from``, else the base model (``model.name_or_path``, or the
    ``model.gguf_file`` inside it); ``None``: a model built from scratch."""
    return cfg.stage.init_from or cfg.model.source


def tokenizer_source(cfg: TrainConfig) -> str | None:
    """Where the stage's tokenizer comes from (``None``: built from scratch by the tiny recipe)."""
    source = start_source(cfg)
    if source is None:
        return None
    return cfg.model.tokenizer if cfg.stage.init_from is None and cfg.model.tokenizer else source


def build_model_and_tokenizer(cfg: TrainConfig, args) -> tuple[Any, Any, str]:
    """``(tokenizer, model, base_model)``; ``base_model`` names what the pipeline started from (for prove.json)."""
    source = start_source(cfg)
    if source is not None:
        check_source(source)
        tokenizer = load_tokenizer(tokenizer_source(cfg) or source, cfg.model.trust_remote_code)
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
    meta = read_prove_json(source) if Path(source).is_dir() else None
    return meta.base_model if meta is not None else source


def scratch_tokenizer(cfg: TrainConfig):
    """The tiny recipe's BPE, trained on the training rows once per run and reused (every rank, every resume)."""
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


def embedding_rows(model) -> int:
    """Rows of the input embedding matrix (also under ZeRO-3, where the local weight is a placeholder)."""
    weight = model.get_input_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def ensure_mask_token(model, tokenizer, token: str) -> int:
    """Add ``token`` as a special token; give it a spare embedding row, else resize the embeddings (docs/design.md §2.1).

    Qwen2.5's embedding matrix has spare rows (151,665 tokens, 151,936/152,064 rows): the new id lands
    in one and nothing is resized. Returns the token's id.
    """
    if token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [token]}, replace_extra_special_tokens=False
        )
    token_id = tokenizer.convert_tokens_to_ids(token)
    rows = embedding_rows(model)
    if token_id >= rows:
        log.info("resizing the embeddings %d -> %d rows for %s", rows, len(tokenizer), token)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    else:
        log.info("%s is id %d, inside the %d-row embedding matrix: no resize", token, token_id, rows)
    return token_id


def mask_token_id(model: Any, tokenizer: Any, token: str, add: bool) -> int | None:
    """The placeholder's id: added when ``add`` (stage mars), else looked up (``None`` when the tokenizer lacks it).

    Stage sft records it too when present, so its checkpoint decodes with block methods after mars."""
    if add:
        return ensure_mask_token(model, tokenizer, token)
    return tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None


def apply_lora(model, cfg: TrainConfig, mask_id: int | None):
    """Wrap ``model`` in a LoRA adapter (``cfg.peft``); ``mask_id``'s embedding row trains too when given."""
    p = cfg.peft
    train_tokens = [mask_id] if (p.train_mask_token and mask_id is not None) else None
    lora = LoraConfig(
        r=p.r,
        lora_alpha=p.alpha,
        lora_dropout=p.dropout,
        target_modules=list(p.target_modules),
        task_type="CAUSAL_LM",
        trainable_token_indices=train_tokens,
    )
    model = get_peft_model(model, lora)
    model.print_trainable_parameters()
    return model
