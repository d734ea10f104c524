"""The static slot cache (``prove.decode.engine.cache``) against transformers' ``DynamicCache`` on the same model:
linear passes, rejected passes (a length, not a crop), tree passes and the gated copy, with every stale slot
holding finite garbage."""

from __future__ import annotations

import pytest
import torch
from prove.decode.engine import tree_attention_bias
from prove.decode.engine.cache import SlotCache, linear_mask, tree_mask, unsupported_reason
from transformers import DynamicCache

from tests.numerics import assert_logits_match, assert_same_function

CAP = 48


def _dyn(model, cache, ids, positions, mask=None):
    kw = {"attention_mask": mask} if mask is not None else {}
    out = model(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        past_key_values=cache,
        use_cache=True,
        **kw,
    )
    return out.logits[0]


def _slot(model, cache: SlotCache, ids, positions, slots, mask):
    cache.set_slots(torch.tensor(slots))
    out = model(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        past_key_values=cache,
        attention_mask=mask,
        use_cache=True,
    )
    return out.logits[0]


def _linear(model, cache: SlotCache, ids, start):
    n = len(ids)
    mask = linear_mask(torch.tensor(start), n, cache.capacity, torch.float32)
    return _slot(model, cache, ids, list(range(start, start + n)), list(range(start, start + n)), mask)


def _garbage(cache: SlotCache, valid: int, seed: int) -> None:
    """Finite garbage in every slot at or past ``valid`` (large values: a leak would show)."""
    g = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        for buf in (layer.keys, layer.values):
            buf[:, :, valid:] = torch.randn(buf[:, :, valid:].shape, generator=g) * 50


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_slot_cache_equals_dynamic_cache_on_linear_and_rejected_passes(make_lm, impl):
    """Fails if a stale slot leaks into a pass (the mask or the slot arithmetic is off by one), if RoPE reads the
    slot count instead of position_ids, or if a rejection needs a crop: a draft of 5 tokens is fed, 2 of them are
    'accepted' (the length moves by 3), and the next pass overwrites the rest."""
    model = make_lm(seed=3, attn=impl)
    prompt = [5, 17, 40, 9, 23, 11, 8]
    dyn, slot = DynamicCache(config=model.config), SlotCache.for_model(model, CAP)
    ref = _dyn(model, dyn, prompt[:-1], list(range(6)))
    got = _linear(model, slot, prompt[:-1], 0)
    assert_logits_match(got, ref, model, context=CAP)
    _garbage(slot, 6, seed=1)
    # a draft pass over [pending, d1..d4] at positions 6..10
    draft = [prompt[-1], 30, 31, 32, 33]
    ref = _dyn(model, dyn, draft, list(range(6, 11)))
    got = _linear(model, slot, draft, 6)
    assert_logits_match(got, ref, model, context=CAP)
    # accept pending + d1 + d2: the DynamicCache crops 2, the slot cache only moves its length to 9
    dyn.crop(-2)
    slot.length = 9
    _garbage(slot, 9, seed=2)  # whatever sat at 9, 10 (and past) must not matter
    nxt = [50, 51, 52]
    ref = _dyn(model, dyn, nxt, list(range(9, 12)))
    got = _linear(model, slot, nxt, 9)
    assert_logits_match(got, ref, model, context=CAP)
    assert torch.isfinite(got).all()


def test_slot_cache_equals_dynamic_cache_on_a_tree_pass_and_the_gated_copy(make_lm):
    """A tree pass (a chain at slot = position, a second branch written past it) then the gated copy of the
    accepted branch entry into place: the next pass must equal a DynamicCache that held the accepted path all
    along. Fails if the copy moves gated-off pairs, reads after writing, or the tree mask lets a branch see the
    chain it replaces."""
    model = make_lm(seed=4, attn="eager")
    prompt = [3, 14, 15, 9, 26, 5]
    L = len(prompt) - 1  # valid entries; prompt[-1] pending
    slot = SlotCache.for_model(model, CAP)
    _linear(model, slot, prompt[:-1], 0)
    slot.length = L
    _garbage(slot, L, seed=3)
    # tree: pending c at L, chain y1 y2 at L+1, L+2; branch z (replacing y1) at position L+1 with y2 after it
    c, y1, y2, z = prompt[-1], 60, 61, 62
    ids = [c, y1, y2, z, y2]
    positions = [L, L + 1, L + 2, L + 1, L + 2]
    slots = [L, L + 1, L + 2, L + 3, L + 4]  # chain at slot = position; the branch past it
    attend = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool
    )  # y1; y2←y1; z; y2'←z
    local = tree_attention_bias(0, 1, attend)[0, 0] == 0  # (5, 5): may attend
    mask = tree_mask(torch.tensor(L), torch.tensor(slots), local, CAP, torch.float32)
    got = _slot(model, slot, ids, positions, slots, mask)
    # reference: a DynamicCache per branch
    ref_dyn = DynamicCache(config=model.config)
    _dyn(model, ref_dyn, prompt[:-1], list(range(L)))
    ref_main = _dyn(model, ref_dyn, [c, y1, y2], [L, L + 1, L + 2])
    ref_dyn.crop(-2)
    ref_branch = _dyn(model, ref_dyn, [z, y2], [L + 1, L + 2])
    assert_logits_match(got[:3], ref_main, model, context=CAP)
    assert_logits_match(got[3:], ref_branch, model, context=CAP)
    # accept c, z, y2' (the branch): copy slots L+3, L+4 → L+1, L+2; a third pair (gated off) must not move
    slot.gated_copy(
        torch.tensor([L + 3, L + 4, L + 2]),
        torch.tensor([L + 1, L + 2, L + 5]),
        torch.tensor([True, True, False]),
    )
    slot.length = L + 3
    _garbage(slot, L + 3, seed=4)
    nxt = [70, 71]
    got = _linear(model, slot, nxt, L + 3)
    ref = _dyn(model, ref_dyn, nxt, [L + 3, L + 4])
    assert_logits_match(got, ref, model, context=CAP)


def test_gated_copy_moves_only_gated_pairs():
    """Fails if a gated-off pair overwrites its destination or pairs see each other's writes (a swap)."""
    cache = SlotCache(1, 6)
    k = torch.arange(6, dtype=torch.float32).reshape(1, 1, 6, 1)
    cache.set_slots(torch.arange(6))
    cache.update(k, k.clone(), 0)
    cache.gated_copy(torch.tensor([1, 0, 4]), torch.tensor([0, 1, 5]), torch.tensor([True, True, False]))
    assert cache.layers[0].keys.flatten().tolist() == [1, 0, 2, 3, 4, 5]


def test_unsupported_models_are_named():
    """Fails if a hybrid (linear-attention), dynamic-RoPE or flash-attention model is let onto the slot cache (it
    would decode wrong: flash attention ignores the float mask over the slots), or a sliding-window one is refused or
    given the wrong window kind."""
    from prove.decode.engine.cache import attention_window
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    assert unsupported_reason(Qwen2Config(num_hidden_layers=2)) is None
    assert unsupported_reason(LlamaConfig(num_hidden_layers=2)) is None
    mixed = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert unsupported_reason(mixed) is None and attention_window(mixed) == (8, True)
    everywhere = MistralConfig(num_hidden_layers=2, sliding_window=8)
    assert unsupported_reason(everywhere) is None and attention_window(everywhere) == (8, False)
    unused = Qwen2Config(num_hidden_layers=2, use_sliding_window=False, sliding_window=8)
    assert attention_window(unused) == (None, False)
    hybrid = Qwen2Config(num_hidden_layers=2)
    hybrid.layer_types = ["full_attention", "linear_attention"]
    assert "linear_attention layers" in (unsupported_reason(hybrid) or "")
    flash = Qwen2Config(num_hidden_layers=2)
    flash._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in (unsupported_reason(flash) or "")
    dyn = LlamaConfig(num_hidden_layers=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "dynamic" in (unsupported_reason(dyn) or "")


def test_grouped_sdpa_equals_sdpa_and_copies_no_kv_head(make_lm, monkeypatch):
    """``grouped_sdpa`` (the query heads of a K/V head folded into its rows) equals transformers' sdpa under a
    slot mask, and an sdpa model under ``native_gqa`` never repeats its K/V heads (transformers' ``repeat_kv``).
    Fails if the fold pairs a query head with the wrong K/V head, repeats the mask in the wrong order, or if the
    switch does not take (or is not undone)."""
    from prove.decode.engine.cache import GROUPED_SDPA, grouped_sdpa, native_gqa
    from transformers.integrations import sdpa_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 6, 5, 8, generator=g),
        torch.randn(1, 2, 20, 8, generator=g),
        torch.randn(1, 2, 20, 8),
    )
    mask = linear_mask(torch.tensor(11), 5, 20, torch.float32)  # (1, 1, 5, 20): 11 valid slots, then the pass
    layer = torch.nn.Module()
    layer.num_key_value_groups, layer.is_causal = 3, True
    got, _ = grouped_sdpa(layer, q, k, v, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (1, 5, 6, 8)
    assert_same_function(got, want, reduction=20, depth=2, argmax=False)

    model = make_lm(seed=3, attn="sdpa")
    repeats = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda h, n: repeats.append(n) or real(h, n))
    cache = SlotCache.for_model(model, CAP)
    with torch.no_grad(), native_gqa(model):
        assert model.config._attn_implementation == GROUPED_SDPA
        got = _linear(model, cache, [5, 17, 40, 9], 0)
    assert repeats == [] and model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        want = _linear(model, SlotCache.for_model(model, CAP), [5, 17, 40, 9], 0)
    assert repeats  # plain sdpa under a mask does repeat them
    assert_logits_match(got, want, model, context=CAP)
