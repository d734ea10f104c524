"""The oracle of every greedy method: a plain loop with no cache at all, the pure rules, and nothing of the engine.

Each cycle recomputes every pass from the whole sequence (a causal LM's logits at a position depend on nothing
later, so this is what any correct cache must reproduce): the block proposal is the model over
``seq + [<|mask|>] × (k − 1)``, a draft proposes k tokens one full pass each, a verifier scores ``seq + y``. Stopping
is AR's: the first EOS (kept), the token that completes a stop string (kept), ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from prove.decode.rules.block import greedy_match, mars_rule, prove_rule
from prove.decode.rules.speculative import AsdState, asd_greedy, nsd_greedy
from prove.decode.sampling import restrict, token_prob


def _logits(
    model, ids: list[int], rows: int, allowed: torch.Tensor | None = None, vocab: int | None = None
) -> torch.Tensor:
    """The last ``rows`` rows of ``model`` over ``ids``, no cache; on the target's vocabulary (``vocab``: cut or padded
    with −inf), restricted to ``allowed``, or as the model gives them (``vocab`` None: ProVe's verifier)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -rows:].float()
    if vocab is None:
        return out
    if out.shape[-1] < vocab:
        out = torch.cat([out, out.new_full((rows, vocab - out.shape[-1]), float("-inf"))], -1)
    return restrict(out[:, :vocab], allowed)


def oracle(
    method: str,
    target,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    K: int,
    mask_id: int | None = None,
    verifier=None,
    draft=None,
    allowed: torch.Tensor | None = None,
    eos: Sequence[int] = (),
    stop: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
    theta: float = 0.0,
    tau: float = 0.0,
    asd: dict | None = None,
) -> list[int]:
    """The new tokens of a greedy decode of ``method`` (ar, mars, prove, prove-lossless, sd, nsd, asd, pard)."""
    V = target.get_output_embeddings().weight.shape[0]
    seq, new, state = list(prompt), [], AsdState()
    verified = method not in ("mars", "prove")  # the target scores the block and adds a token
    while True:
        k = 0 if method == "ar" else min(K, max_new_tokens - len(new) - verified)
        if method in ("mars", "prove", "prove-lossless", "pard"):  # a block pass
            blocker = draft if method == "pard" else target
            probs = (
                torch.softmax(_logits(blocker, seq + [mask_id] * (k - 1), k, allowed, V), -1) if k else None
            )
            conf, y = (
                probs.max(-1) if probs is not None else (torch.zeros(0), torch.zeros(0, dtype=torch.long))
            )
        else:  # a draft's k passes, stopping after an EOS
            ys: list[int] = []
            for _ in range(k):
                ys.append(int(_logits(draft, seq + ys, 1, allowed, V)[0].argmax()))
                if ys[-1] in eos:
                    break
            y, conf = torch.tensor(ys, dtype=torch.long), torch.ones(len(ys))
        g = _logits(target, seq + y.tolist(), len(y) + 1, allowed, V) if verified else None
        if method == "mars":
            verdict = mars_rule(conf, tau)
        elif method == "prove":
            q = token_prob(_logits(verifier, seq + y.tolist(), len(y) + 1)[: len(y)], y)
            verdict = prove_rule(conf, q, theta)
        elif method == "nsd":
            verdict = nsd_greedy(y, g, theta)
        elif method == "asd":
            verdict, state = asd_greedy(y, g, state, block_size=len(y), **(asd or {}))
        else:
            verdict = greedy_match(y, g)
        tokens = y[: verdict.n].tolist() + ([verdict.extra] if verdict.extra is not None else [])
        for t in tokens:
            new.append(int(t))
            seq.append(int(t))
            text = decode(new) if stop and decode is not None else ""
            if int(t) in eos or len(new) >= max_new_tokens or any(s in text for s in stop):
                return new
