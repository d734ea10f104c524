"""The checkpoint contract between training and decoding (docs/design.md §2.2).

A stage writes a plain Hugging Face directory (config.json, safetensors, tokenizer including
``<|mask|>``) plus ``prove.json``. Decoding meets training only through this file: ``prove.decode``
never imports ``prove.train``.
"""

from __future__ import annotations

import dataclasses
import json
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
    path = Path(directory) / PROVE_JSON
    path.write_text(json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read_prove_json(directory: str | Path) -> ProveMeta | None:
    """The checkpoint's ``prove.json``, or ``None`` for a stock HF model directory or a hub id."""
    path = Path(directory) / PROVE_JSON
    if not path.is_file():
        return None
    return ProveMeta.from_dict(json.loads(path.read_text()))
