"""The draft proposer of the speculative-decoding family (SD, NSD, ASD): a small AR model sharing the
target's tokenizer proposes y_1..y_k in k sequential passes (Leviathan et al. 2023; Chen et al. 2023).

Pass i feeds only y_{i-1} (plus whatever committed tokens its cache lacks) and predicts y_i. The proposed
tokens' KV is speculative (``ModelRunner.forward(..., committed=len(seq))``): the engine's per-cycle sync
keeps the entries of accepted tokens and crops the rest, so after every cycle the draft's DynamicCache
holds exactly the committed prefix, as for every other model.

Draft length (``threshold``, the ``draft_threshold`` parameter). With a threshold the draft stops after the first
token whose probability under the draft is below it, that token included: the rule at transformers' assisted
generation's default (``assistant_confidence_threshold`` 0.4, where transformers also adapts it as it goes). A
poor draft then drafts one or two tokens a cycle instead of k, saving draft passes and verification width. When
to stop depends only on the draft's own draws, so speculative sampling stays exact: each proposed position is
tested against the target exactly as before, and positions never proposed are never tested.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from prove.decode.engine import ModelRunner
from prove.decode.proposers.base import Proposal
from prove.decode.sampling import logits_to_probs, pick, restrict


class DraftProposer:
    """``k`` sequential passes of ``runner``'s model; greedy (``temperature == 0``) or sampled.

    ``vocab_size`` is the target's number of logit rows: draft logits are cut or padded (with -inf) to it,
    so the draft never proposes a token the target cannot score (nor one outside ``allowed``: ``<|mask|>``), and ``Proposal.probs`` (k, V) lives on
    the target's vocabulary, as the speculative-sampling rules need. ``probs`` is
    ``logits_to_probs(logits, temperature, top_k, top_p)``: the distribution each y_i was drawn from.
    """

    def __init__(
        self,
        runner: ModelRunner,
        k: int,
        *,
        vocab_size: int,
        threshold: float = 0.0,
        allowed: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"the draft lookahead k={k} must be ≥ 1")
        self.runner = runner
        self.k = k
        self.threshold = threshold
        self.vocab_size = vocab_size
        self.allowed = allowed
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator
        self.stop_tokens: frozenset[int] = frozenset()
        """The request's EOS ids (the engine sets them): drafting stops after proposing one, since nothing
        after an EOS can be committed (transformers' assisted generation stops its draft there too)."""

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """(Vd,) draft logits → (V,) on the target's vocabulary."""
        V = self.vocab_size
        if logits.shape[-1] >= V:
            return restrict(logits[..., :V], self.allowed)
        pad = logits.new_full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"))
        return restrict(torch.cat([logits, pad], -1), self.allowed)

    def propose(self, seq: Sequence[int], budget: int) -> Proposal:
        k = min(self.k, budget)
        seq = list(seq)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for _ in range(k):
            logits = self._fit_vocab(self.runner.forward(seq + tokens, committed=len(seq))[-1])  # (V,)
            probs = logits_to_probs(logits, self.temperature, self.top_k, self.top_p)  # (V,)
            tokens.append(int(pick(probs, self.temperature, self.generator)))
            rows.append(probs)
            if tokens[-1] in self.stop_tokens or float(probs[tokens[-1]]) < self.threshold:
                break
        device = self.runner.device
        if not tokens:
            return Proposal.empty(device)
        y = torch.tensor(tokens, dtype=torch.long, device=device)  # (k,)
        probs = torch.stack(rows)  # (k, V)
        return Proposal(tokens=y, conf=probs.gather(-1, y[:, None])[:, 0], probs=probs)
