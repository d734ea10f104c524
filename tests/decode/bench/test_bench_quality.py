"""The bench's quality numbers (:mod:`prove.decode.bench.quality`): distinct-n and the row summary on hand-made data,
and the teacher-forced scoring against a direct computation on tiny models."""

from __future__ import annotations

import math

import pytest
import torch
from prove.decode.bench.quality import TokenScores, distinct_n, quality_summary, score_output


def test_distinct_n_counts_ngrams_within_outputs_only():
    """Catches: n-grams spanning two outputs (``[1, 2] + [2, 1]`` would add (2, 2)), a per-output mean instead of the
    pooled ratio, n off by one."""
    outs = [[1, 2, 1, 2], [2, 1]]
    assert distinct_n(outs, 1) == pytest.approx(2 / 6)
    assert distinct_n(outs, 2) == pytest.approx(2 / 4)  # (1,2) (2,1) (1,2) | (2,1)
    assert distinct_n([[5]], 2) is None
    with pytest.raises(ValueError, match="n ≥ 1"):
        distinct_n(outs, 0)


def test_quality_summary_hand_numbers():
    """Two prompts: the row's second output is empty. Catches: agreement averaged per prompt instead of per token,
    the log-likelihood delta taken against the wrong row or over prompts where one side is empty, the length of the
    reference reported instead of the row's."""
    row = [TokenScores([-1.0, -3.0], [True, False]), TokenScores([], [])]
    ref = [TokenScores([-1.0, -1.0, -1.0], [True, True, True]), TokenScores([-0.5], [True])]
    q = quality_summary(row, ref, [[7, 8], []])
    assert q["token_agreement"] == pytest.approx(1 / 2)
    assert q["loglik"] == pytest.approx(-2.0)
    assert q["loglik_vs_ar"] == pytest.approx(-2.0 - -1.0)  # prompt 2 has no row token: left out
    assert q["mean_length"] == pytest.approx(1.0)
    assert q["distinct"] == {"1": 1.0, "2": 1.0}
    with pytest.raises(ValueError, match="same prompts"):
        quality_summary(row, ref[:1], [[7, 8], []])


def test_score_output_reads_the_right_positions_and_the_scorer(lm, small):
    """One output after a prompt: the log-probabilities are the *scorer's* at the positions that predict each output
    token, greedy agreement the *target's* argmax over the allowed ids. Catches: logits read one position late, the
    target's log-likelihood reported for the scorer's, the allowed mask ignored (an excluded id still counted as the
    greedy choice)."""
    prompt = [5, 9, 13, 17]
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = []
        for _ in range(5):  # the target's own greedy continuation, then one changed token
            nxt = int(lm(input_ids=ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    out[3] = (out[3] + 1) % lm.config.vocab_size
    s = score_output(lm, small, prompt, out)
    assert s.greedy[:3] == [True, True, True] and s.greedy[3] is False
    with torch.no_grad():
        full = torch.tensor([[*prompt, *out]])
        want = torch.log_softmax(small(input_ids=full).logits[0].float(), -1)
    for i, tok in enumerate(out):
        assert s.logprobs[i] == pytest.approx(float(want[len(prompt) - 1 + i, tok]), abs=1e-5)
    same = score_output(lm, lm, prompt, out)
    assert not all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(same.logprobs, s.logprobs, strict=True))
    allowed = torch.ones(lm.config.vocab_size, dtype=torch.bool)
    allowed[out[0]] = False  # the greedy first token is not allowed: its argmax over the rest differs
    assert score_output(lm, small, prompt, out, allowed).greedy[0] is False
    assert score_output(lm, small, prompt, []) == TokenScores([], [])
