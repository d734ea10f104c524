"""Padded passes (``pad_widths=auto``): the plan from a cost curve, a padded pass against an unpadded one, the
calibration's widths, and whole decodes equal to transformers' greedy generate with every pass padded."""

from __future__ import annotations

import pytest
from prove.decode import Decoder
from prove.decode.config import DecodeParams
from prove.decode.engine import ModelRunner, padding
from prove.decode.engine.pass_cost import measure_pass_cost

from tests.decode.decode_helpers import hf_generate, mask_ids
from tests.numerics import assert_caches_match, assert_logits_match

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

# SmolLM2-135M's linear pass by width on the 2-core CPU, ms (docs/benchmarks.md, 2026-12-05 05:47)
SMOLLM2_WIDTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]
SMOLLM2_MS = [65.2, 108.3, 129.5, 97.5, 96.8, 111.6, 134.7, 100.5, 112.9, 118.7, 115.4]


def test_pad_plan_on_a_measured_curve():
    # 2 and 3 run faster as 5 (96.8 < 0.95 × 108.3); 4 is within the margin of 5 and stays; 6 and 7 run as 8;
    # 9 has nothing cheaper wider (12: 115.4 > 112.9); 1 is the cheapest of all
    assert padding.pad_plan(SMOLLM2_WIDTHS, SMOLLM2_MS) == {2: 5, 3: 5, 6: 8, 7: 8}


def test_pad_plan_margin_and_flat_curves():
    # a GPU-like curve (flat, a little noise): nothing is padded
    assert padding.pad_plan([1, 2, 3, 4], [10.0, 10.2, 9.9, 10.1]) == {}
    # 4 % cheaper is inside the default 5 % margin; with no margin it pads
    assert padding.pad_plan([1, 2], [100.0, 96.0]) == {}
    assert padding.pad_plan([1, 2], [100.0, 96.0], margin=0.0) == {1: 2}
    # never narrower: a cheaper narrow pass does not make a wide one pad
    assert padding.pad_plan([1, 2, 3], [1.0, 5.0, 9.0]) == {}
    # equal cheapest wider passes: the narrowest of them
    assert padding.pad_plan([1, 2, 3], [9.0, 5.0, 5.0]) == {1: 2}
    with pytest.raises(ValueError, match="increasing widths"):
        padding.pad_plan([2, 1], [1.0, 1.0])


def test_pad_widths_parses_and_refuses():
    assert DecodeParams(pad_widths="auto").pad_widths == "auto"
    assert DecodeParams(pad_widths=False).pad_widths == "off"
    with pytest.raises(ValueError, match="give auto or off"):
        DecodeParams(pad_widths="sometimes")


def _forward_widths(model) -> list[int]:
    """Records the width of every forward pass of ``model`` (its ``input_ids`` columns)."""
    seen: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    return seen


def test_padded_passes_equal_unpadded(make_lm):
    plain, padded = ModelRunner(make_lm(seed=0)), ModelRunner(make_lm(seed=0))
    padded.pad_to = {1: 3, 4: 7}
    widths = _forward_widths(padded.model)
    seq = [5, 9, 2, 7]  # prefill: width 4 → 7
    steps = [
        (seq, []),  # prefill
        (seq + [11], [3, 3, 8]),  # width 4 → 7: a verification after a commit
        (seq + [11, 3], []),  # width 1 → 3 (the cache keeps [11, 3]'s prefix; the pass re-feeds 3)
        (seq + [11, 3, 4], [6, 1, 2, 9]),  # width 5: not in the plan
    ]
    for s, extra in steps:
        for r in (plain, padded):
            r.sync(s)
        a, b = plain.forward(s, extra), padded.forward(s, extra)
        assert a.shape == b.shape == (len(extra) + 1, a.shape[1])
        assert_logits_match(b, a, padded.model)
        # the filler's entries are gone: every later pass sees the same cache
        assert padded.cached == plain.cached == len(padded.fed) and padded.fed == plain.fed
        assert_caches_match(padded.cache.layers, plain.cache.layers, padded.model, slots=plain.cached)
    assert widths == [7, 7, 3, 5] and padded.padded == 3 and plain.padded == 0


def test_tree_passes_are_never_padded(make_lm):
    from prove.decode.engine.tree import tree_layout

    runner = ModelRunner(make_lm(seed=0))
    runner.pad_to = {w: w + 2 for w in range(1, 20)}
    widths = _forward_widths(runner.model)
    seq = [5, 9, 2, 7]
    runner.forward(seq)
    chain = tree_layout(3, [])
    runner.forward_tree(seq, [1, 2, 3], offsets=chain.offsets, attend=chain.attend, chain=3)
    assert widths == [6, 4] and runner.padded == 1


def test_linear_calibration_times_full_widths(make_lm):
    # a reused row would make every timed linear pass one token narrower than the width it is filed under
    model = make_lm(seed=0)
    widths = _forward_widths(model)
    seconds = measure_pass_cost(model, [1, 2, 5], context=list(range(10)), repeats=2, linear=True)
    assert len(seconds) == 3 and min(seconds) > 0
    assert widths == [10, 1, 2, 5, 5, 2, 1]  # the context, then narrow → wide, wide → narrow


@pytest.mark.parametrize("method,k", [("prove-lossless", 4), ("prove-lossless", 16), ("ar", None)])
def test_padded_decode_equals_hf_generate(lm, tokenizer, prompts, monkeypatch, method, k):
    """Every linear pass padded by 3 (a plan as a CPU's curve could give): still transformers' greedy, token for
    token, and the stats count the padded passes."""
    monkeypatch.setattr(
        padding,
        "plan_for",
        lambda model, widths: padding.PadPlan(
            tuple(widths), (1.0,) * len(widths), {w: w + 3 for w in widths}
        ),
    )
    dec = Decoder(lm, tokenizer, method=method, block_size=k, pad_widths="auto")
    plain = Decoder(lm, tokenizer, method=method, block_size=k)
    assert dec.models.target.pad_to and not plain.models.target.pad_to
    for p in prompts:
        ref = hf_generate(lm, p, 30, suppress=mask_ids(tokenizer))
        out = dec.generate(p, max_new_tokens=30, eos_token_id=[])
        assert out.token_ids == ref
        # every pass no wider than the widest measured one is padded (a long prompt's prefill is not)
        measured = max(padding.pad_widths_needed(k, None))
        assert out.stats.padded_passes == out.stats.model_passes - (len(p) > measured)
        assert out.stats.cycles == plain.generate(p, max_new_tokens=30, eos_token_id=[]).stats.cycles


def test_pad_auto_measures_each_model_once(lm, small, tokenizer, monkeypatch):
    seen: list[int] = []

    def fake_cost(model, widths, *, context, repeats, linear):
        assert linear
        seen.append(id(model))
        return [1.0 if w == 8 else 2.0 for w in widths]  # width 8 is the cheap one

    monkeypatch.setattr("prove.decode.engine.pass_cost.measure_pass_cost", fake_cost)
    monkeypatch.setattr(padding, "_PLANS", padding.IdentityMemo(16))
    for _ in range(2):
        dec = Decoder(lm, tokenizer, method="prove", verifier=small, block_size=4, pad_widths="auto")
        assert dec.models.target.pad_to == {w: 8 for w in range(1, 8)} == dec.models.verifier.pad_to
        assert dec.pad_plans["model"].record()["pad_to"]["7"] == 8 and set(dec.pad_plans) == {
            "model",
            "verifier",
        }
    assert sorted(seen) == sorted([id(lm), id(small)])  # the second Decoder reuses both plans
