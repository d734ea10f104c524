"""Turning logits into the distributions that proposers draw from and rules compare (pure torch).

With ``temperature == 0`` (greedy) the distribution is the plain softmax (temperature 1): proposers
take its argmax, and its value there is the confidence p̃ that the confidence rules threshold.
With ``temperature > 0`` it is the tempered softmax restricted by top-k and top-p, exactly the
distribution a token is then sampled from, so speculative-sampling rules that compare proposer
and target distributions stay exact.
"""

from __future__ import annotations

import torch
from prove.decode.engine.memo import IdentityMemo
from prove.decode.rules.speculative import warp_probs


def logits_to_probs(
    logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """``logits`` (..., V) → probabilities (..., V) in float32: the plain softmax when greedy, else
    ``warp_probs`` (temperature, then top-k, then top-p; the same warping the speculative rules use)."""
    if temperature == 0:
        return torch.softmax(logits.float(), dim=-1)
    return warp_probs(logits, temperature, top_p=top_p, top_k=top_k)


def restrict(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """``logits`` (..., V) with every id outside ``allowed`` (V,) bool set to -inf: never drawn, never the argmax.

    Adds a (V,) penalty of 0 / -inf (one kernel; a ``masked_fill`` with the negated mask is two and cost a
    few times more on small rows, every cycle), built once per ``allowed`` tensor and dtype: ``allowed`` is
    never written once made (``Models.allowed``)."""
    if allowed is None:
        return logits
    return logits + _penalty(allowed, logits.dtype, logits.device)


_PENALTIES: IdentityMemo[torch.Tensor] = IdentityMemo(16)
"""Per ``allowed`` mask, dtype and device (a decode uses one or two masks; a (V,) penalty is 0.6 MB at V = 152k)."""


def _penalty(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _PENALTIES.get(
        (allowed,),
        (dtype, device),
        lambda: torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
            ~allowed.to(device), float("-inf")
        ),
    )


def token_prob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Softmax probability of each ``tokens[i]`` (k,) under ``logits[i]`` (≥ k, V) → (k,)."""
    k = tokens.shape[0]
    return torch.softmax(logits[:k].float(), -1).gather(-1, tokens[:, None])[:, 0]


def pick(probs: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Argmax (temperature 0) or one sample per row of ``probs`` (..., V) → token ids (...)."""
    if temperature == 0:
        return probs.argmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return drawn.reshape(probs.shape[:-1])
