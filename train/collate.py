"""Batch collation for the training stages: right padding, MARS's per-example block padding, and stage distill's
proposer top-k tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from prove.data.chat import IGNORE_INDEX
from prove.train.masks import padded_length


@dataclass(frozen=True)
class Collator:
    """Pads ``{input_ids, labels}`` rows into a right-padded batch.

    With ``block_size`` K > 1 (stage mars), each example is first padded to a multiple of K with
    ``eos_token_id`` *labelled* as a target (docs/design.md §2.1): the model learns to keep emitting EOS inside
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


@dataclass(frozen=True)
class DistillCollator:
    """Right-pads ``input_ids`` / ``labels`` (:class:`Collator`) and the top-k tensors
    ``(B, L, k)``, whose entry at a label position t holds the proposer's top-k for token t (zeros elsewhere)."""

    pad_token_id: int

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = Collator(pad_token_id=self.pad_token_id)(rows)
        if rows and "topk_ids" in rows[0]:
            bsz, width = batch["input_ids"].shape
            k = next((len(r["topk_ids"][0]) for r in rows if len(r["topk_ids"])), 1)
            ids = torch.zeros((bsz, width, k), dtype=torch.long)  # (B, L, k)
            logp = torch.zeros((bsz, width, k), dtype=torch.float32)  # (B, L, k)
            for i, row in enumerate(rows):
                r = len(row["topk_ids"])
                if r == 0:
                    continue
                p = len(row["input_ids"]) - r  # the response occupies the last r positions
                ids[i, p : p + r] = torch.tensor(row["topk_ids"], dtype=torch.long)
                logp[i, p : p + r] = torch.tensor(row["topk_logprobs"], dtype=torch.float32)
            batch["topk_ids"], batch["topk_logprobs"] = ids, logp
        return batch
