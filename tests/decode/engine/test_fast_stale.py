"""The fast path against stale slots on every mask it builds, on four model families.

Before every cycle, each slot cache gets ±50 junk in the slots of its view that the cycle must not read (at and past
the first slot the cycle writes) and NaN in every slot past the view (``SlotCache.view``, the bucket). A mask one slot
too wide reads junk; a view one slot short hides an entry a row must see; a read past the view meets NaN. Each
method must still give its oracle's tokens: transformers' greedy ``generate`` for the lossless ones, the reference
loop (``fast=false``) for the lossy ones, and for sampled sd the same engine with clean caches under the same seed.
The mutants at the end show that the check fails on each of those three mistakes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from prove.decode import Decoder
from prove.decode.engine import cycles
from prove.decode.engine import device as fast

from tests.conftest import make_qwen2, redraw
from tests.decode.decode_helpers import hf_generate, mask_ids

FAMILIES = ["qwen2-eager", "qwen2-sdpa", "llama-tied", "qwen3", "qwen2-untied"]
N = 23  # max_new_tokens: not a multiple of K + 1, so the budget ends inside a block


def build(family: str, vocab: int, seed: int, std: float):
    """A tiny random model of ``family`` (fp32, 1024 positions), every weight matrix drawn with ``std``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if family.startswith("qwen2"):
        attn = "eager" if family == "qwen2-eager" else "sdpa"
        return make_qwen2(vocab, seed=seed, init_std=std, attn=attn, tie=family != "qwen2-untied")
    torch.manual_seed(seed)
    shape = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=1024, tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip
    if family == "llama-tied":
        model = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    else:  # qwen3: RMSNorm on q and k per head
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **shape)).eval()
    redraw(model, std, seed)
    return model


@pytest.fixture(scope="module")
def models(tokenizer):
    """Per family: the target (narrow init: its blocks are often accepted, so endings fall inside them) and a second
    model (ProVe's verifier, asd's draft)."""
    V = len(tokenizer)
    return {f: (build(f, V, seed=7, std=0.12), build(f, V, seed=8, std=0.2)) for f in FAMILIES}


def poison(engine, seed: int, prefill: bool = False) -> None:
    """±50 junk in each cache's slots from the first one the next cycle writes up to its view, NaN past the view.
    The first slot written: the pending token's (``pos``) for a verify pass or a tree; ``pos − npend + 1`` for a
    block pass over pending tokens (prove's target, pard's draft); ``pos − 1`` for sd's draft (it re-feeds prev);
    slot 0 for a prefill (whatever an earlier request left is stale)."""
    g = torch.Generator().manual_seed(seed)
    pos = 0 if prefill else int(engine.pos)
    pending = int(engine.npend) - 1 if engine.pends and not prefill else 0
    first = {"cache": pos - pending if engine.verifier is not None else pos}
    if engine.draft is not None:
        first["draft_cache"] = pos - pending if engine.block_draft else max(pos - 1, 0)
    if engine.verifier is not None:
        first["verifier_cache"] = pos
    for name, lo in first.items():
        cache = getattr(engine, name)
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            for buf in (layer.keys, layer.values):
                junk = buf[:, :, lo : cache.view]
                junk.copy_(torch.randn(junk.shape, generator=g) * 50)
                buf[:, :, cache.view :] = float("nan")


def poisoned(dec: Decoder, views: str = "bucket") -> Decoder:
    """``dec`` whose fast engine poisons its caches before every cycle (regular or narrowed) and every prefill.
    ``views``: "bucket" (the shapes a GPU's graphs and compiles run: views rounded up to a power of two, the most
    masked slots, a prompt pass of its own) or "exact" (an eager CPU engine's: the slots in use, an unmasked last
    row, the prompt riding on each model's first linear pass)."""
    engine = dec.fast_engine
    assert engine is not None
    assert engine.exact_views, "a Decoder on the CPU builds an eager engine"
    engine.exact_views = views == "exact"
    step, calls = engine.step, [0]

    def cycle(k):
        calls[0] += 1
        poison(engine, calls[0])
        return step(k)

    def prefill(prompt):
        engine._view(len(prompt))
        poison(engine, 0, prefill=True)
        return fill(prompt)

    engine.step = cycle  # narrowed (eager) cycles
    engine._regular = cycle  # regular-width cycles
    fill, engine.prefill = engine.prefill, prefill
    return dec


METHODS = {
    "ar": dict(method="ar"),
    "prove-lossless": dict(method="prove-lossless"),
    "fused": dict(method="prove-lossless", fuse=True, fuse_groups="all"),
    "sd": dict(method="sd", draft="self"),
    "sd-sampled": dict(method="sd", draft="other", temperature=0.8),
    "prove": dict(method="prove", verifier="other", theta=0.05),
    "pard": dict(method="pard", draft="self"),
    "asd": dict(method="asd", draft="other"),
}
LOSSLESS = ("ar", "prove-lossless", "fused", "sd", "pard")


def _decoder(models, family, method, K, tokenizer, **over) -> Decoder:
    target, other = models[family]
    kw = dict(METHODS[method])
    for role in ("draft", "verifier"):
        if role in kw:
            kw[role] = target if kw[role] == "self" else other
    if kw["method"] in ("prove-lossless", "prove", "pard"):
        kw["block_size"] = K
    elif kw["method"] != "ar":
        kw["k"] = K
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "records no trained block size"
        return Decoder(target, tokenizer, **{**kw, **over})


def _endings(ref: list[int], tokenizer) -> list[dict]:
    """Three ways a request ends inside a block: the budget, an EOS token and a stop string, each past the first
    few tokens of ``ref`` (the unstopped output)."""
    i = next((j for j in range(5, len(ref)) if ref[j] not in ref[:j]), len(ref) - 1)
    text = tokenizer.decode(ref[: i + 1], skip_special_tokens=False)
    return [
        dict(max_new_tokens=N, eos_token_id=[]),
        dict(max_new_tokens=N, eos_token_id=[ref[i]]),
        dict(max_new_tokens=N, eos_token_id=[], stop=[text[-2:]]),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("views", ["bucket", "exact"])
@pytest.mark.parametrize("K", [4, 16])
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_stale_slots_change_no_token(family, method, K, views, models, tokenizer, prompts):
    dec = poisoned(_decoder(models, family, method, K, tokenizer, fast=True), views)
    # sampled sd: the same engine with clean caches (the reference loop draws otherwise); else the reference loop
    ref = _decoder(models, family, method, K, tokenizer, fast=method == "sd-sampled")
    target = models[family][0]
    for p in (prompts[1], prompts[3]):
        whole = ref.generate(p, max_new_tokens=N, eos_token_id=[], seed=3).token_ids
        if method in LOSSLESS:
            assert whole == hf_generate(target, p, N, suppress=mask_ids(tokenizer)), (family, method, K)
        for end in _endings(whole, tokenizer):
            want = ref.generate(p, seed=3, **end).token_ids
            got = dec.generate(p, seed=3, **end).token_ids
            assert got == want, (family, method, K, end)


def build_sliding(kind: str, vocab: int, window: int):
    """A tiny random model whose attention slides: Qwen2 with its second layer sliding (``layer_types``, a mask per
    layer type) or Mistral with every layer sliding (one mask)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(7)
    shape = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=1024, attn_implementation="sdpa", sliding_window=window,
    )  # fmt: skip
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=1, **shape)).eval()
    else:
        model = MistralForCausalLM(MistralConfig(**shape)).eval()
    redraw(model, 0.12, 7)
    return model


@pytest.mark.parametrize("views", ["bucket", "exact"])
@pytest.mark.parametrize("method", ["ar", "prove-lossless", "fused", "sd", "pard"])
@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_sliding_window_models_are_served_with_the_window_in_the_mask(
    kind, method, views, tokenizer, prompts
):
    """A context three times the window (24): the fast path's tokens equal transformers' greedy ``generate`` (which
    applies the window itself), stale slots and all. Fails if the window is dropped (the rows read the whole
    prefix), applied to the full-attention layers of a mixed model, or off by one."""
    target = build_sliding(kind, len(tokenizer), window=24)
    models = {"sliding": (target, target)}
    dec = poisoned(_decoder(models, "sliding", method, 4, tokenizer, fast=True), views)
    p = prompts[3]  # 70 tokens
    want = hf_generate(target, p, N, suppress=mask_ids(tokenizer))
    assert dec.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids == want
    full = build_sliding(kind, len(tokenizer), window=4096)  # the same weights, a window that never bites
    assert hf_generate(full, p, N, suppress=mask_ids(tokenizer)) != want  # so the window matters here


# -- the check fails on each mistake it is for ---------------------------------------------------------------------


def _fails(models, tokenizer, prompts, mutate, method: str = "prove-lossless", views: str = "bucket") -> bool:
    """Whether the stale-slot check fails (on qwen2-sdpa, K = 4) once ``mutate()`` has run (after the Decoder is
    built: its self-check would refuse most mutants first)."""
    dec = poisoned(_decoder(models, "qwen2-sdpa", method, 4, tokenizer, fast=True), views)
    target = models["qwen2-sdpa"][0]
    want = hf_generate(target, prompts[3], N, suppress=mask_ids(tokenizer))
    mutate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN logits
        got = dec.generate(prompts[3], max_new_tokens=N, eos_token_id=[]).token_ids
    return got != want


@pytest.mark.parametrize("views", ["bucket", "exact"])
@pytest.mark.parametrize("method", ["ar", "prove-lossless", "sd"])
def test_the_check_passes_unmutated(method, views, models, tokenizer, prompts):
    assert not _fails(models, tokenizer, prompts, lambda: None, method=method, views=views)


def test_a_view_one_slot_short_fails(models, tokenizer, prompts, monkeypatch):
    # ar: its one row must see its own entry, the last slot of the view (a block's last row matters only when the
    # whole block is accepted)
    mutate = lambda: monkeypatch.setattr(fast, "bucket", lambda used, capacity: used - 1)  # noqa: E731
    assert _fails(models, tokenizer, prompts, mutate, method="ar")


def test_an_exact_view_one_slot_short_fails(models, tokenizer, prompts, monkeypatch):
    real = fast.FastEngine._view
    mutate = lambda: monkeypatch.setattr(fast.FastEngine, "_view", lambda self, used: real(self, used - 1))  # noqa: E731
    assert _fails(models, tokenizer, prompts, mutate, method="ar", views="exact")


def test_an_unmasked_row_that_is_not_the_views_last_is_caught(models, tokenizer, prompts, monkeypatch):
    """sd's draft passes are one row each, below the slots its verify pass writes: unmasked, they read junk. sd is
    lossless, so the tokens stay; what the draft proposed (the acceptance by depth) changes."""
    dec = poisoned(_decoder(models, "qwen2-sdpa", "sd", 4, tokenizer, fast=True), "exact")
    run = lambda: dec.generate(prompts[3], max_new_tokens=N, eos_token_id=[])  # noqa: E731
    clean = run()
    monkeypatch.setattr(fast.FastEngine, "_unmasked", lambda self, model, cache, start: True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN logits
        mutated = run()
    assert mutated.stats.accepted_by_depth != clean.stats.accepted_by_depth


def test_a_prompt_riding_one_slot_off_fails(models, tokenizer, prompts, monkeypatch):
    real = fast.FastEngine._forward

    def forward(self, ids, start, rows, *, role="model"):
        if role in self._prefix:  # the prompt's first token lost: the rest one slot early
            self._prefix[role] = self._prefix[role][1:]
        return real(self, ids, start, rows, role=role)

    mutate = lambda: monkeypatch.setattr(fast.FastEngine, "_forward", forward)  # noqa: E731
    assert _fails(models, tokenizer, prompts, mutate, method="ar", views="exact")


def test_a_mask_one_slot_too_wide_fails(models, tokenizer, prompts, monkeypatch):
    from prove.decode.engine import cache as slot_cache

    def wide(start, width, view):  # each row also sees the slot after its own
        return slot_cache.linear_see(start + 1, width, view)

    assert _fails(models, tokenizer, prompts, lambda: monkeypatch.setattr(cycles, "linear_see", wide))


def test_a_read_past_the_view_fails(models, tokenizer, prompts, monkeypatch):
    from prove.decode.engine import cache as slot_cache

    real = fast.SlotCache.update

    def whole(self, key_states, value_states, layer_idx, *args, **kwargs):  # every slot, as before the views
        real(self, key_states, value_states, layer_idx)
        layer = self.layers[layer_idx]
        return layer.keys, layer.values

    def mutate():
        monkeypatch.setattr(fast.SlotCache, "update", whole)
        monkeypatch.setattr(cycles, "linear_see", lambda s, w, _view: slot_cache.linear_see(s, w, 1024))

    assert _fails(models, tokenizer, prompts, mutate)
