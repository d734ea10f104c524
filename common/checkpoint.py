"""The checkpoint contract between training and decoding (docs/design.md §2.2).

A stage writes a plain Hugging Face directory (config.json, safetensors, tokenizer including
``<|mask|>``) plus ``prove.json``. Decoding meets training only through this file: ``prove.decode``
never imports ``prove.train``. A block-trained checkpoint's ``config.json`` carries ``mask_token_id``
too, where vLLM's parallel drafting reads the drafter's placeholder id (docs/vllm.md).

The checks both backends make of a checkpoint before decoding with it (its mask token, its trained block
size) live here, so the engine's ``Decoder`` and the vLLM adapter say the same thing.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The contract's placeholder token and the checks both sides share live in prove.data.loading; re-exported here.
from prove.data.loading import MASK_TOKEN as MASK_TOKEN
from prove.data.loading import vocab_difference as vocab_difference

PROVE_JSON = "prove.json"


@dataclass(frozen=True)
class ProveMeta:
    """What ``prove.json`` records about a checkpoint."""

    stage: str
    """The stage that wrote it: ``sft``, ``mars`` or ``distill``."""
    base_model: str
    """Hub id or path of the model the stage started from."""
    block_size: int | None = None
    """K the model was block-trained with (``None`` unless stage is ``mars``)."""
    mask_token: str | None = None
    """The placeholder token string, normally ``<|mask|>``."""
    mask_token_id: int | None = None
    """Its id in the saved tokenizer."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else a stage records (training config, the proposer a verifier was distilled from, ...)."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        return {**d, **extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProveMeta:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        missing = {"stage", "base_model"} - d.keys()
        if missing:
            raise ValueError(f"prove.json lacks {sorted(missing)}; re-save the checkpoint with prove-train")
        return cls(
            **{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names}
        )


def write_prove_json(directory: str | Path, meta: ProveMeta) -> Path:
    """Write ``prove.json``; a block-trained checkpoint's id of ``<|mask|>`` also goes into its config.json."""
    path = Path(directory) / PROVE_JSON
    path.write_text(json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
    if meta.block_size is not None and meta.mask_token_id is not None:
        write_config_mask_id(directory, meta.mask_token_id)
    return path


CONFIG_JSON = "config.json"
CONFIG_MASK_KEY = "mask_token_id"
"""The config.json key vLLM's parallel drafting reads the drafter's placeholder id from (the first of the keys it
tries: ``dflash_config.mask_token_id``, ``mask_token_id``, ``pard_token``, ``ptd_token_id``)."""


def config_mask_id(directory: str | Path) -> int | None:
    """The ``mask_token_id`` a checkpoint's config.json records (``None``: none, or no config.json)."""
    path = Path(directory) / CONFIG_JSON
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get(CONFIG_MASK_KEY)
    return None if value is None else int(value)


def write_config_mask_id(directory: str | Path, mask_token_id: int) -> bool:
    """Record ``mask_token_id`` in the checkpoint's config.json, every other key kept as it is; False when the
    directory has no config.json (a LoRA adapter folder). Transformers keeps an unknown config key as an
    attribute, so the checkpoint loads as before."""
    path = Path(directory) / CONFIG_JSON
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    if config.get(CONFIG_MASK_KEY) != mask_token_id:
        config[CONFIG_MASK_KEY] = int(mask_token_id)
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True


def read_prove_json(directory: str | Path) -> ProveMeta | None:
    """The checkpoint's ``prove.json``, or ``None`` for a stock HF model directory or a hub id."""
    path = Path(directory) / PROVE_JSON
    if not path.is_file():
        return None
    return ProveMeta.from_dict(json.loads(path.read_text()))


def find_mask_token_id(name: str, tokenizer: Any, meta: ProveMeta | None, given: int | None = None) -> int:
    """The id of a block proposer's ``<|mask|>``: ``given``, else the tokenizer's, else prove.json's (only without a
    tokenizer); a ``ValueError`` naming the fix when the checkpoint has none."""
    if given is None and tokenizer is not None and MASK_TOKEN in tokenizer.get_vocab():
        given = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if given is None and meta is not None and meta.mask_token_id is not None and tokenizer is None:
        given = meta.mask_token_id
    if given is None:
        raise ValueError(
            f"checkpoint {name} has no {MASK_TOKEN} token: train it with `prove-train stage=mars` "
            "or pick method=ar/sd"
        )
    return int(given)


def resolve_block_size(name: str, meta: ProveMeta | None, requested: int | None, stacklevel: int = 3) -> int:
    """K for a block proposer: ``requested``, or the trained K (prove.json) when ``None``. Above the trained K is a
    ``ValueError`` (the model never learnt to fill those placeholders); without a recorded K the requested one is
    taken with a warning, and none at all is an error."""
    trained = meta.block_size if meta is not None else None
    if trained is None:
        if requested is None:
            raise ValueError(
                f"checkpoint {name} records no trained block size (no prove.json with block_size): "
                "pass block_size=K"
            )
        why = "no prove.json" if meta is None else f"its prove.json is from stage {meta.stage!r}, not mars"
        warnings.warn(
            f"checkpoint {name} records no trained block size ({why}); using block_size={requested} as given",
            stacklevel=stacklevel,
        )
        return requested
    if requested is None:
        return trained
    if requested > trained:
        raise ValueError(
            f"block_size={requested} exceeds the block size {trained} that {name} was trained with "
            f"(prove.json): pass block_size={trained} or less"
        )
    return requested
