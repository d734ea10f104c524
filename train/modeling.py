"""Loading the model and tokenizer a stage starts from, and adding MARS's ``<|mask|>`` token."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.train.config import ModelConfig, ScratchConfig

log = logging.getLogger(__name__)

def _torch_dtype(name: str):
    import torch

    if name == "auto":
        return "auto" if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)  # float32 | bfloat16 | float16 (ModelConfig checks the name)


def check_source(source: str) -> None:
    """A local-looking path that does not exist is a user error, not a hub lookup."""
    from prove.decode.checkpoint import missing_local_path

    if missing_local_path(source):
        raise ValueError(
            f"no model at {source!r}: for stage=mars run stage=sft first (it writes this directory), "
            "or set stage.init_from=<checkpoint dir> / model.name_or_path=<hub id or dir>"
        )


def load_tokenizer(source: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer of {source!r} has no eos_token: set one (e.g. <|im_end|> for ChatML models)")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(source: str, cfg: ModelConfig):
    """``from_pretrained`` (under ZeRO-3 the weights load partitioned when TrainingArguments exist first)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        source,
        dtype=_torch_dtype(cfg.dtype),
        attn_implementation=cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code,
    )


def scratch_model(arch: ScratchConfig, tokenizer: Any, cfg: ModelConfig, seed: int):
    """A randomly initialised Qwen2 sized by ``arch`` for ``tokenizer`` (DESIGN §5)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

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
        config, dtype=_torch_dtype(cfg.dtype), attn_implementation=cfg.attn_implementation
    )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def embedding_rows(model) -> int:
    """Rows of the input embedding matrix (also under ZeRO-3, where the local weight is a placeholder)."""
    weight = model.get_input_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def ensure_mask_token(model, tokenizer, token: str) -> int:
    """Add ``token`` as a special token; give it a spare embedding row, else resize the embeddings (DESIGN §2.1).

    Qwen2.5's embedding matrix has spare rows (151,665 tokens, 151,936/152,064 rows): the new id lands
    in one and nothing is resized. Returns the token's id.
    """
    if token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [token]}, replace_extra_special_tokens=False)
    token_id = tokenizer.convert_tokens_to_ids(token)
    rows = embedding_rows(model)
    if token_id >= rows:
        log.info("resizing the embeddings %d -> %d rows for %s", rows, len(tokenizer), token)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    else:
        log.info("%s is id %d, inside the %d-row embedding matrix: no resize", token, token_id, rows)
    return token_id
