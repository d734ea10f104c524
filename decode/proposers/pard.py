"""PARD (Parallel Draft; An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
Adaptation"): a small block model drafts for a bigger target of the same tokenizer.

The draft is a MARS-trained checkpoint (``draft=``): it reads ``[pending, M×(K−1)]`` in one pass, exactly as the
block proposer does on the model itself (``prove.decode.proposers.block``), and the target verifies the K tokens
(greedy match + correction / bonus, method ``pard``). vLLM runs the same cycle as ``draft_model`` with
``parallel_drafting`` (``prove.decode.vllm.backend``). Nothing here is new but the model the block pass runs on
and a vocabulary fit: a small model of the same tokenizer may have fewer or more padded rows than the target
(Qwen2.5-0.5B has 151,936, Qwen2.5-32B 152,064), so its logits are cut or padded with -inf to the target's.
"""

from __future__ import annotations

from typing import Any

import torch
from prove.decode.engine import ModelRunner
from prove.decode.proposers.base import Proposal
from prove.decode.proposers.block import BlockProposer


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., Vd) logits → (..., vocab_size): rows past ``vocab_size`` cut, missing rows -inf (never drawn)."""
    if logits.shape[-1] >= vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], -1)


class PardProposer(BlockProposer):
    """A ``BlockProposer`` on the draft model's runner whose proposals live on the target's vocabulary."""

    def __init__(
        self, runner: ModelRunner, mask_token_id: int, block_size: int, *, vocab_size: int, **kwargs: Any
    ) -> None:
        super().__init__(runner, mask_token_id, block_size, **kwargs)
        self.vocab_size = vocab_size

    def draw(self, logits: torch.Tensor) -> Proposal:
        return super().draw(fit_vocab(logits, self.vocab_size))  # (k, V) on the target's rows
