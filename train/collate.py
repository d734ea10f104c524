"""Batch collation for the training stages: right padding, plus MARS's per-example block padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from prove.train.masks import IGNORE_INDEX, padded_length


@dataclass(frozen=True)
class Collator:
    """Pads ``{input_ids, labels}`` rows into a right-padded batch.

    With ``block_size`` K > 1 (stage mars), each example is first padded to a multiple of K with
    ``eos_token_id`` *labelled* as a target (DESIGN §2.1): the model learns to keep emitting EOS inside
    a block after the answer ends. Batch padding then uses ``pad_token_id`` with label -100 and, since
    every example already ends on a block boundary, fills whole blocks that no real token attends.
    """

    pad_token_id: int
    eos_token_id: int | None = None
    block_size: int = 1

    def __post_init__(self) -> None:
        if self.block_size > 1 and self.eos_token_id is None:
            raise ValueError("block padding needs eos_token_id: set the tokenizer's eos_token")

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids_list, lab_list = [], []
        for row in rows:
            ids = [int(t) for t in row["input_ids"]]
            labels = [int(t) for t in row["labels"]]
            if self.block_size > 1:
                assert self.eos_token_id is not None
                extra = padded_length(len(ids), self.block_size) - len(ids)
                ids += [self.eos_token_id] * extra
                labels += [self.eos_token_id] * extra
            ids_list.append(ids)
            lab_list.append(labels)
        width = max(len(x) for x in ids_list)
        batch_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)  # (B, L)
        batch_labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)  # (B, L)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, L)
        for i, (ids, lab) in enumerate(zip(ids_list, lab_list, strict=True)):
            batch_ids[i, : len(ids)] = torch.tensor(ids)
            batch_labels[i, : len(lab)] = torch.tensor(lab)
            attention_mask[i, : len(ids)] = 1
        return {"input_ids": batch_ids, "labels": batch_labels, "attention_mask": attention_mask}
