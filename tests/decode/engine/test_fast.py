"""The fast path (``prove.decode.engine.device``) on the CPU (no graphs): the same tokens as transformers' greedy
``generate`` and the same per-cycle stats as the reference loop, the regular cycle under
``torch.compile(fullgraph=True)`` with recompiles fatal, and its one-line errors."""

from __future__ import annotations

import pytest
import torch
from prove.decode import Decoder
from prove.decode.rules.twins import InjectedAcceptance

from tests.decode.decode_helpers import hf_generate, mask_ids

N = 24


@pytest.fixture(scope="module")
def echo_lm(make_lm):
    """A random model with a narrow init: its block passes are often right, so blocks of several tokens get
    accepted and EOS / stop strings / max_new_tokens fall inside them."""
    return make_lm(seed=7, std=0.12)


@pytest.fixture(scope="module")
def fast_refs(lm, echo_lm, prompts, tokenizer):
    return {
        name: [hf_generate(m, p, N, suppress=mask_ids(tokenizer)) for p in prompts[:3]]
        for name, m in (("lm", lm), ("echo", echo_lm))
    }


def _narrowed(stats, max_new_tokens, k, adds=1):
    """Whether the reference loop narrowed this request's last cycle to the token budget (its block smaller than
    k): the case where the fast path's full-width last cycle must be cut on the host."""
    left = max_new_tokens - sum(stats.committed_per_cycle[:-1])
    return left - adds < k


def _stats_key(stats):
    return (
        stats.committed_per_cycle,
        stats.accepted_by_depth,
        stats.proposed_by_depth,
        stats.model_passes,
        stats.new_tokens,
    )


@pytest.mark.parametrize("k", [0, 4, 16])
@pytest.mark.parametrize("which", ["lm", "echo"])
def test_fast_path_equals_generate_and_the_reference_loop(request, k, which, prompts, tokenizer, fast_refs):
    """k = 0 is ``ar``. Fails if a slot, a position or the pending token is off by one (the tokens drift from
    ``generate``), if the device rule commits other tokens than the reference rule, or if EOS / a stop string /
    max_new_tokens cut a block elsewhere than the reference loop does (the per-cycle stats differ). The echo model
    runs with cycle c + 1 launched before cycle c is read (``pipeline``, CUDA's default): a cycle launched ahead
    for a request that had ended must change nothing. Every cycle runs at the regular width (no eager cycle), the
    budget-limited last ones too: fails if they run narrowed again, or if the full-width cycle the host cuts is
    counted otherwise than the reference's narrowed one (its proposed / accepted depths, its passes: none of the
    block pass at k = 0)."""
    model = request.getfixturevalue("lm" if which == "lm" else "echo_lm")
    method = {"method": "ar"} if k == 0 else {"method": "prove-lossless", "block_size": k}
    fast = Decoder(model, tokenizer, fast=True, **method)
    fast.fast_engine.pipeline = which == "echo"
    ref = Decoder(model, tokenizer, fast=False, **method)
    assert fast.fast_engine is not None and ref.fast_engine is None
    inside, narrowed = 0, 0
    for p, want in zip(prompts[:3], fast_refs[which], strict=True):
        cases = [{"max_new_tokens": n, "eos_token_id": []} for n in (1, 5, N)]
        cases += [{"max_new_tokens": N, "eos_token_id": [want[j]]} for j in (3, 9)]
        cases += [{"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]}]
        for kw in cases:
            a, b = fast.generate(p, **kw), ref.generate(p, **kw)
            assert a.token_ids == b.token_ids, kw
            assert _stats_key(a.stats) == _stats_key(b.stats), kw
            assert a.stats.fast is not None and b.stats.fast is None
            assert a.stats.fast["eager_cycles"] == 0, kw
            if not kw["eos_token_id"] and "stop" not in kw:
                assert a.token_ids == want[: kw["max_new_tokens"]]
            last = a.stats.committed_per_cycle[-1]
            inside += last > 1 and len(a.token_ids) < N
            narrowed += _narrowed(b.stats, kw["max_new_tokens"], k)
    if which == "echo" and k > 0:
        assert inside > 0, "no case ended inside a multi-token block: the test lost its point"
    assert k == 0 or narrowed > 0, "the reference narrowed no last cycle: the test lost its point"
    # every cycle has the regular width: one goes ahead wherever the one before may leave budget
    assert (fast.fast_engine.counters["dropped_cycles"] > 0) == (which == "echo")


SYNCS = {"item", "tolist", "nonzero", "_local_scalar_dense", "masked_select", "unique"}
"""Operators that read a device value on the host (or size a tensor by one)."""


def no_sync_backend(gm, example_inputs):
    """``backend="eager"`` that first refuses a captured graph holding a host sync: torch ≥ 2.13 traces
    ``.item()`` / ``int(t)`` into the graph as a data-dependent value instead of breaking it, so ``fullgraph=True``
    alone no longer catches one."""
    found = [str(n.target) for n in gm.graph.nodes if getattr(n.target, "__name__", str(n.target)) in SYNCS]
    found += [
        str(n.target) for n in gm.graph.nodes if str(n.target).split(".")[-2:-1] == ["_local_scalar_dense"]
    ]
    assert not found, f"host syncs inside the cycle: {found}"
    return gm.forward


def test_no_sync_backend_catches_a_host_read():
    """The backend itself: fails if it let ``int(t)`` (a host read traced as a value) through."""

    def f(x):
        x.add_(int(x.sum()) + 1)
        return x

    torch._dynamo.reset()
    with pytest.raises(Exception, match="host syncs inside the cycle"):
        torch.compile(f, fullgraph=True, backend=no_sync_backend)(torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("mode", ["unfused", "fused", "sd", "sd-sampled", "prove", "pard", "asd"])
def test_regular_cycle_compiles_whole_without_syncs_or_recompiles(
    echo_lm, lm, small, tokenizer, prompts, mode
):
    """The regular-width cycle of every cycle of a whole decode under ``torch.compile(fullgraph=True)`` with
    recompiles fatal after a warm-up decode. Fails on a host sync (``.item()``, ``int(t)``, ``.tolist()``,
    ``nonzero``) or any graph break inside the cycle, and on shape or value drift that recompiles (e.g. a Python
    int position, or prove's pending count read as an int). Sampled sd draws from the cycle's buffer of uniforms
    (filled outside the step): a generator or a host read inside the step fails here."""
    torch._dynamo.reset()
    if mode.startswith("sd"):
        kw = {"method": "sd", "draft": lm, "k": 4}
        if mode == "sd-sampled":
            kw.update(temperature=0.8, top_k=20, top_p=0.9)
    elif mode == "prove":
        kw = {"method": "prove", "verifier": small, "block_size": 4, "theta": PROVE_THETA}
    elif mode == "pard":
        kw = {"method": "pard", "draft": lm, "block_size": 4}
    elif mode == "asd":
        kw = {"method": "asd", "draft": lm, "k": 4}
    else:
        kw = {"method": "prove-lossless", "block_size": 4, "fuse": mode == "fused", "fuse_groups": "all"}
    dec = Decoder(echo_lm, tokenizer, fast=True, **kw)
    compiled = []

    def wrap(step):
        fn = torch.compile(step, fullgraph=True, backend=no_sync_backend)
        compiled.append(fn)
        return fn

    dec.fast_engine.wrap_step(wrap)
    want = [dec.generate(p, max_new_tokens=N, eos_token_id=[], seed=3).token_ids for p in prompts[:2]]
    ref = Decoder(echo_lm, tokenizer, fast=False, **kw)
    with torch.compiler.set_stance("fail_on_recompile"):
        for p, w in zip(prompts[:2], want, strict=True):
            out = dec.generate(p, max_new_tokens=N, eos_token_id=[], seed=3)
            assert out.token_ids == w  # sampled: the same draws under the same seed, compiled or not
            if mode != "sd-sampled":  # greedy: the reference loop's tokens
                assert w == ref.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids
            # asd and sampled sd narrow their last cycles to the budget and run them eagerly; the others run every
            # cycle at the regular width, through the compiled step
            eager = out.stats.fast["eager_cycles"]
            assert out.stats.fast["cycles"] > eager >= 1 if mode in ("sd-sampled", "asd") else eager == 0
    assert len(compiled) == 1


def test_fast_true_refuses_what_it_cannot_serve(make_lm, lm, small, tokenizer, prompts):
    """Fails if fast=true silently falls back (or crashes later) on a method, a setting or a model it does not
    serve, or lets a request outgrow the cache it allocated."""
    cases = [
        ({"method": "mars", "block_size": 4}, "method mars has no rule twin"),
        ({"method": "prove-lossless", "block_size": 1, "fuse": True}, "needs block_size ≥ 2"),
        ({"method": "prove-lossless", "block_size": 4, "draft_threshold": 0.5}, "draft_threshold"),
        (
            {"method": "prove", "verifier": small, "block_size": 4, "temperature": 0.7},
            "method prove has no sampling twin",
        ),
        ({"method": "prove-lossless", "block_size": 4, "fuse": True}, "not fuse_groups=auto"),
        ({"method": "prove-lossless", "block_size": 4, "fuse": True, "fuse_groups": 2}, "not fuse_groups=2"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=f"fast=true cannot serve this decode: .*{match}.*fast=false"):
            Decoder(lm, tokenizer, fast=True, **kw)
    with pytest.raises(
        ValueError, match=r"it records no trace \(trace=false\); pass fast=auto or fast=false"
    ):
        Decoder(lm, tokenizer, method="ar", fast=True, trace=True)
    with pytest.raises(
        ValueError, match="on_cycle reads the composed cycle.s proposal and logits: pass fast=false"
    ):
        Decoder(lm, tokenizer, method="ar", fast=True).generate(prompts[0], max_new_tokens=2, on_cycle=print)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    window = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "layer_types": None}
    sliding = Qwen2ForCausalLM(Qwen2Config(**{**lm.config.to_dict(), **window})).eval()
    assert sliding.config.layer_types == ["full_attention", "sliding_attention"]
    with pytest.raises(
        ValueError, match=r"sliding window \(4\) is not wider than a pass's span \(10 .*fast=false"
    ):
        Decoder(sliding, tokenizer, method="prove-lossless", block_size=4, fast=True)
    # auto on the CPU: the reference path (the demo's speed is unchanged)
    assert Decoder(lm, tokenizer, method="ar").fast_engine is None
    dec = Decoder(lm, tokenizer, method="ar", fast=True, cache_len=12)
    with pytest.raises(
        ValueError, match=r"need 13 KV slots but the device cycle allocated 12: .*cache_len=13"
    ):
        dec.generate(prompts[0][:4], max_new_tokens=10)
    assert len(dec.generate(prompts[0][:4], max_new_tokens=9, eos_token_id=[]).token_ids) == 9
    with pytest.raises(ValueError, match="fast='yes': give true, false or auto"):
        Decoder(lm, tokenizer, method="ar", fast="yes")


SENTINEL = 7.0
"""What the boundary test fills every slot with before a request: a slot still holding it was never written."""

# (the Decoder's kw, pipeline, injected counts, max_new_tokens, slots past prompt + max_new_tokens at K = 4, whether
# the request reaches its last slot): each max_new_tokens is one where the worst case happens — a cycle whose whole
# block the device commits past the budget, launched with 2 tokens left (ahead of it: one more full cycle) or 1 left
SLOT_CASES = {
    "ar": ({"method": "ar"}, True, None, 8, -1, True),
    # whole blocks (injected): K + 1 a cycle, 10 new tokens before the cycle with 2 left, whose K + 1 end at slot
    # P − 1 + 15 and the cycle ahead writes its verify pass K past that
    "unfused": ({"method": "prove-lossless", "block_size": 4}, True, [4], 12, 2 * 4 - 1, True),
    "unfused-serial": ({"method": "prove-lossless", "block_size": 4}, False, [4], 11, 4 - 1, True),
    "fused": (
        {"method": "prove-lossless", "block_size": 4, "fuse": True, "fuse_groups": "all"},
        True,
        [3],
        11,
        16 + 4 - 3,
        True,
    ),
    # a draft equal to the target: whole blocks, as injected above
    "sd": ({"method": "sd", "k": 4, "draft": "echo"}, True, None, 12, 2 * 4 - 1, True),
    "prove": ({"method": "prove", "block_size": 4, "theta": 0.0}, True, None, 10, 2 * 4 - 2, True),
    "pard": ({"method": "pard", "block_size": 4, "draft": "echo"}, True, None, 12, 2 * 4 - 1, False),
    "asd": ({"method": "asd", "k": 4, "draft": "lm"}, True, None, 9, -1, True),
}


@pytest.mark.parametrize("case", list(SLOT_CASES))
def test_the_cache_holds_exactly_the_slots_a_request_writes(case, echo_lm, lm, small, tokenizer, prompts):
    """``slots_needed`` at the boundary: a request that needs exactly the allocated slots runs, and (where the
    trajectory is forced to the worst case) writes the last one; with one slot less it is refused with the
    message. The full-width last cycles write past the budget into scratch, and with ``pipeline`` a cycle launched
    ahead of one that committed K + 1 past the budget writes further still. Fails if the scratch is sized short
    (a write past the buffer raises on the CPU), or longer than what some request writes (the last slot stays
    untouched), or if the formula forgets the pipeline (the serial and pipelined cases differ)."""
    import warnings

    kw, pipeline, injected, m, extra, tight = SLOT_CASES[case]
    kw = dict(kw)
    if "draft" in kw:
        kw["draft"] = {"echo": echo_lm, "lm": lm}[kw["draft"]]
    if kw["method"] == "prove":
        kw["verifier"] = small
    p = prompts[0][:5]
    need = len(p) + m + extra

    def build(cache_len):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pard: "records no trained block size"
            dec = Decoder(echo_lm, tokenizer, fast=True, cache_len=cache_len, **kw)
        dec.fast_engine.pipeline = pipeline
        if injected is not None:
            dec.fast_engine.set_rule(InjectedAcceptance(injected, "cpu"))
        return dec

    dec = build(need)
    eng = dec.fast_engine
    assert eng.slots_needed(len(p), m) == need
    dec.generate(p, max_new_tokens=2, eos_token_id=[])  # allocates every buffer
    caches = [eng.cache] + [getattr(eng, n) for n in ("draft_cache", "verifier_cache") if hasattr(eng, n)]
    for c in caches:
        c.fill(SENTINEL)
    out = dec.generate(p, max_new_tokens=m, eos_token_id=[])
    assert len(out.token_ids) == m and out.stats.fast is not None
    if tight:
        written = [bool((layer.keys[..., -1, :] != SENTINEL).any()) for c in caches for layer in c.layers]
        assert any(written), f"{case}: slot {need - 1} never written: {need} slots is more than it needs"
    with pytest.raises(
        ValueError,
        match=rf"need {need} KV slots but the device cycle allocated {need - 1}: .*cache_len={need}",
    ):
        build(need - 1).generate(p, max_new_tokens=m, eos_token_id=[])


def test_injected_acceptance_sets_each_cycles_count(lm, tokenizer, prompts):
    """The benchmark's rule twin (gpu-check's injected acceptance): fails if the preset counts do not decide each
    cycle's committed length (n + 1, n capped by the block), if a request does not start over at the first count, or
    if greedy matching passed back does not restore the model's greedy output."""
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=4, fast=True)
    want = dec.generate(prompts[0], max_new_tokens=20, eos_token_id=[]).token_ids
    dec.fast_engine.set_rule(InjectedAcceptance([3, 1, 9], "cpu"))
    out = dec.generate(prompts[0], max_new_tokens=20, eos_token_id=[])
    assert out.stats.committed_per_cycle == [4, 2, 5, 4, 2, 3]  # the last: 2 tokens of budget left
    again = dec.generate(prompts[0], max_new_tokens=20, eos_token_id=[])
    assert (
        again.stats.committed_per_cycle == out.stats.committed_per_cycle
    )  # each request from the first count
    dec.fast_engine.set_rule(None)
    assert dec.generate(prompts[0], max_new_tokens=20, eos_token_id=[]).token_ids == want


@pytest.mark.parametrize("k", [4, 16])
def test_fused_fast_path_equals_generate(k, echo_lm, prompts, tokenizer, fast_refs):
    """Fused prove-lossless on the fast path (every group, one tree pass a cycle). Fails if a group's position or
    mask is off (its proposals go wrong: tokens per cycle collapse, caught against the reference fused run), if a
    placeholder's stale K/V leaks into a later pass, or if the host cuts a block elsewhere than AR would."""
    fast = Decoder(
        echo_lm, tokenizer, method="prove-lossless", block_size=k, fuse=True, fuse_groups="all", fast=True
    )
    fast.fast_engine.pipeline = True  # fused: always one cycle ahead
    ref = Decoder(
        echo_lm, tokenizer, method="prove-lossless", block_size=k, fuse=True, fuse_groups="all", fast=False
    )
    assert fast.fast_engine is not None and fast.fast_engine.fused and fast.params.fuse_groups == "all"
    per_pass = []
    for p, want in zip(prompts[:3], fast_refs["echo"], strict=True):
        for kw in (
            {"max_new_tokens": N, "eos_token_id": []},
            {"max_new_tokens": 7, "eos_token_id": []},
            {"max_new_tokens": N, "eos_token_id": [want[9]]},
            {"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]},
        ):
            a, b = fast.generate(p, **kw), ref.generate(p, **kw)
            assert a.token_ids == b.token_ids, kw
            if not kw["eos_token_id"] and "stop" not in kw:
                assert a.token_ids == want[: kw["max_new_tokens"]]
            assert a.stats.model_passes == a.stats.cycles
            per_pass.append((a.stats.new_tokens / a.stats.cycles, b.stats.new_tokens / b.stats.model_passes))
    # the same proposals as the reference's fused groups, case by case (it adds a second candidate, so it may do a
    # little better); some cycles must accept, or the comparison says nothing
    assert all(f >= 0.9 * r for f, r in per_pass), per_pass
    assert max(f for f, _ in per_pass) > 1.1


class CacheLengthPositions(torch.nn.Module):
    """A causal LM that reads its positions from the cache's length and builds its own causal mask, ignoring
    ``position_ids`` and a given mask: what the slot cache cannot serve (its length is the engine's)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, past_key_values=None, position_ids=None, attention_mask=None, use_cache=True,
                logits_to_keep=0):  # fmt: skip
        return self.inner(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache)


def test_self_check_refuses_a_model_the_slot_cache_breaks(lm, tokenizer):
    """The self-check run when a Decoder takes the fast path: fails if a model that ignores position_ids and the
    mask (positions from the cache length) passes it — it would decode wrong on the slot cache."""
    from prove.decode.engine.check import self_check

    assert self_check(lm) is None
    broken = CacheLengthPositions(lm)
    assert "differ from the model's own" in (self_check(broken) or "")
    for fast in (False, True):  # every cycle runs on the slot cache: refused at start either way
        with pytest.raises(
            ValueError,
            match="the model cannot decode on this engine's slot cache: the slot cache's logits differ",
        ):
            Decoder(broken, tokenizer, method="ar", fast=fast)


def test_a_passed_self_check_is_remembered_per_model_and_a_failure_is_not(
    lm, tokenizer, monkeypatch, tmp_path
):
    """``checked``: the second Decoder of the same model runs no self-check; a model of another config, dtype or
    class does, a failure runs again every time, and a torn file is a miss that the next pass rewrites."""
    import copy

    from prove.decode.engine import check as fast

    monkeypatch.setenv("PROVE_CACHE_DIR", str(tmp_path))
    runs = []
    real = fast.self_check
    monkeypatch.setattr(fast, "self_check", lambda m, **kw: runs.append(type(m).__name__) or real(m, **kw))
    Decoder(lm, tokenizer, method="ar", fast=True)
    Decoder(lm, tokenizer, method="ar", fast=True)
    assert len(runs) == 1  # remembered
    other = copy.deepcopy(lm)
    other.config.rms_norm_eps = 1e-5  # another config: another key
    assert fast.check_key(other) != fast.check_key(lm)
    assert fast.check_key(copy.deepcopy(lm).double()) != fast.check_key(lm)
    assert fast.check_key(copy.deepcopy(lm)) == fast.check_key(lm)  # the same model elsewhere: the same key
    broken = CacheLengthPositions(lm)
    for _ in range(2):
        assert fast.checked(broken) is not None
    assert runs.count("CacheLengthPositions") == 2  # never remembered
    (tmp_path / fast.CHECKS_FILE).write_text('["abc", ')  # torn
    assert fast.checked(lm) is None and len(runs) == 4  # a miss: checked again
    assert fast.checked(lm) is None and len(runs) == 4  # and rewritten whole


class NoHeadNoKeep(torch.nn.Module):
    """A causal LM that exposes no output embeddings and takes no ``logits_to_keep`` (a remote-code model may do
    either): the self-check must name it in one line, not crash the Decoder."""

    def __init__(self, inner, *, head: bool) -> None:
        super().__init__()
        self.inner, self.config, self.head = inner, inner.config, head

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings() if self.head else None

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(
        self, input_ids, past_key_values=None, position_ids=None, attention_mask=None, use_cache=True
    ):
        return self.inner(input_ids=input_ids, past_key_values=past_key_values, position_ids=position_ids,
                          attention_mask=attention_mask, use_cache=use_cache)  # fmt: skip


@pytest.mark.parametrize("head", [True, False])
def test_a_model_without_logits_to_keep_or_a_head_is_checked_and_decodes(lm, tokenizer, prompts, head):
    """Fails if the self-check needs what such a model lacks (it would refuse a model the composed cycle decodes), if
    the composed cycle's tokens differ, or if the device cycle takes the model instead of naming why not."""
    from prove.decode.engine.check import self_check

    model = NoHeadNoKeep(lm, head=head)
    assert self_check(model) is None
    if not head:
        return
    want = Decoder(lm, tokenizer, method="ar").generate(prompts[0], max_new_tokens=8, eos_token_id=[])
    out = Decoder(model, tokenizer, method="ar").generate(prompts[0], max_new_tokens=8, eos_token_id=[])
    assert out.token_ids == want.token_ids
    with pytest.raises(ValueError, match="fast=true cannot serve this decode: .*takes no logits_to_keep"):
        Decoder(model, tokenizer, method="ar", fast=True)


@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize("draft_name", ["same", "other"])
def test_greedy_sd_fast_path_equals_generate_and_the_reference_loop(request, k, draft_name, echo_lm, lm, prompts,
                                                                    tokenizer, fast_refs):  # fmt: skip
    """Greedy sd on the fast path: a draft equal to the target (every block accepted, so EOS, stop strings and
    max_new_tokens fall inside blocks and the draft's missing K/V of y_k must be re-fed) and a different one
    (mostly rejected). Fails if the draft's cache drifts from the committed tokens (its proposals, hence the
    per-cycle stats, differ from the reference loop's), or if the target's tokens differ from ``generate``. The
    budget-limited last cycles run at the regular width too (no eager cycle): fails if they run narrowed, or are
    counted otherwise than the reference's narrowed ones (proposed depths, draft passes: none at k = 0)."""
    draft = echo_lm if draft_name == "same" else lm
    fast = Decoder(echo_lm, tokenizer, method="sd", draft=draft, k=k, fast=True)
    fast.fast_engine.pipeline = True  # one cycle ahead where the budget allows, as on CUDA
    ref = Decoder(echo_lm, tokenizer, method="sd", draft=draft, k=k, fast=False)
    assert fast.fast_engine is not None and fast.fast_engine.draft is not None
    narrowed = 0
    for p, want in zip(prompts[:3], fast_refs["echo"], strict=True):
        for kw in (
            {"max_new_tokens": N, "eos_token_id": []},
            {"max_new_tokens": 7, "eos_token_id": []},
            {"max_new_tokens": 1, "eos_token_id": []},
            {"max_new_tokens": N, "eos_token_id": [want[9]]},
            {"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]},
        ):
            a, b = fast.generate(p, **kw), ref.generate(p, **kw)
            assert a.token_ids == b.token_ids, kw
            on_fast = a.stats.fast is not None  # not the one-token prompt (see below)
            assert not on_fast or a.stats.fast["eager_cycles"] == 0, kw
            if not kw["eos_token_id"]:  # the reference's draft stops at EOS; otherwise the same proposals
                assert _stats_key(a.stats) == _stats_key(b.stats), kw
                assert a.stats.draft_passes == b.stats.draft_passes
                narrowed += on_fast and _narrowed(b.stats, kw["max_new_tokens"], k)
            if not kw["eos_token_id"] and "stop" not in kw:
                assert a.token_ids == want[: kw["max_new_tokens"]]
    assert narrowed > 0, "the reference narrowed no last cycle: the test lost its point"
    if draft_name == "same":  # the whole draft accepted, plus the bonus token
        full = fast.generate(prompts[0], max_new_tokens=N, eos_token_id=[])
        assert full.stats.committed_per_cycle[0] == k + 1
    # a one-token prompt: the draft has no token before the pending one, so the request takes the reference loop
    one = fast.generate(prompts[0][:1], max_new_tokens=5, eos_token_id=[])
    assert one.stats.fast is None
    assert one.token_ids == ref.generate(prompts[0][:1], max_new_tokens=5, eos_token_id=[]).token_ids


PROVE_THETA = 1e-4
"""A θ inside the spread of p̃·q of these random models (p̃·q ≈ 1e-5..1e-3 at V ≈ 300): some blocks are cut."""


@pytest.mark.parametrize("k", [4, 16])
def test_prove_fast_path_equals_the_reference_loop(k, echo_lm, small, prompts, tokenizer):
    """ProVe on the fast path (the target's block pass over its pending tokens and K − 1 placeholders, the small
    verifier's K + 1 pass on its own slot cache, the θ rule's twin, no correction token): the reference loop's
    tokens and per-cycle stats, token for token, at θ = 0 (whole blocks: EOS, stop strings and max_new_tokens fall
    inside them) and at a θ that cuts blocks. Fails if a pending token's slot or position is off (the target's next
    block drifts), a placeholder row sees a padding row or a stale slot, the verifier's cache is one token off, or
    the rule reads p̃ or q from the wrong row. The budget-limited last cycles run the regular width (no eager
    cycle): fails if they run narrowed, or are counted otherwise than the reference's narrowed block (k = the
    tokens left, no correction token)."""
    fast = {t: Decoder(echo_lm, tokenizer, method="prove", verifier=small, block_size=k, theta=t, fast=True)
            for t in (0.0, PROVE_THETA)}  # fmt: skip
    ref = {t: Decoder(echo_lm, tokenizer, method="prove", verifier=small, block_size=k, theta=t, fast=False)
           for t in (0.0, PROVE_THETA)}  # fmt: skip
    fast[0.0].fast_engine.pipeline = True  # one cycle ahead where the budget allows, as on CUDA
    inside, cut, narrowed = 0, 0, 0
    for p in prompts[:2]:
        want = ref[0.0].generate(p, max_new_tokens=N, eos_token_id=[]).token_ids
        cases = [{"max_new_tokens": n, "eos_token_id": []} for n in (1, 5, N)]
        cases += [{"max_new_tokens": N, "eos_token_id": [want[j]]} for j in (2, 9)]
        cases += [{"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]}]
        for theta in (0.0, PROVE_THETA):
            for kw in cases:
                a, b = fast[theta].generate(p, **kw), ref[theta].generate(p, **kw)
                assert a.token_ids == b.token_ids, (theta, kw)
                assert _stats_key(a.stats) == _stats_key(b.stats), (theta, kw)
                assert a.stats.verifier_passes == b.stats.verifier_passes == a.stats.cycles, (theta, kw)
                assert a.stats.fast["eager_cycles"] == 0, (theta, kw)
                narrowed += _narrowed(b.stats, kw["max_new_tokens"], k, adds=0)
                inside += a.stats.committed_per_cycle[-1] > 1 and len(a.token_ids) < kw["max_new_tokens"]
                cut += theta > 0 and any(
                    1 <= c < min(k, len(a.token_ids)) for c in a.stats.committed_per_cycle
                )
    assert inside > 0 and cut > 0 and narrowed > 0, (
        "no case ended inside a block, θ cut none, or the reference narrowed no last cycle: the test lost its point"
    )


def test_sampled_fast_path_is_reproducible_under_a_seed(echo_lm, lm, tokenizer, prompts):
    """Sampled sd and ar on the fast path: fails if the cycle's draws do not come from the Decoder's generator
    (the same seed must give the same tokens, another seed other tokens), or if a sampled request silently took
    the reference loop."""
    for kw in ({"method": "sd", "draft": lm, "k": 4}, {"method": "ar"}):
        dec = Decoder(echo_lm, tokenizer, fast=True, temperature=1.0, **kw)
        runs = [dec.generate(prompts[0], max_new_tokens=N, eos_token_id=[], seed=s) for s in (1, 1, 2)]
        assert all(r.stats.fast is not None for r in runs)
        assert runs[0].token_ids == runs[1].token_ids != runs[2].token_ids


@pytest.mark.parametrize("k", [4, 16])
def test_pard_fast_path_equals_generate_and_the_reference_loop(k, echo_lm, lm, prompts, tokenizer, fast_refs):
    """pard on the fast path (the draft's block pass over everything committed since its last pass, up to K + 1
    pending tokens, then the target's K + 1 verification): ``generate``'s tokens and the reference loop's per-cycle
    stats, with a draft equal to the target (blocks of several tokens accepted, at K = 4 whole ones: EOS, stop
    strings and max_new_tokens fall inside them, and K + 1 tokens are pending) and a different one. Fails if the correction / bonus token is not among the
    draft's pending tokens, or a pending token's slot or position is off (the draft's blocks, hence the stats,
    drift from the reference's). The budget-limited last cycles run the regular width (no eager cycle): fails if
    they run narrowed, or are counted otherwise than the reference's (no draft pass at k = 0)."""
    for draft in (echo_lm, lm):
        kw = {"method": "pard", "draft": draft, "block_size": k}
        with pytest.warns(UserWarning, match="records no trained block size"):
            fast, ref = (
                Decoder(echo_lm, tokenizer, fast=True, **kw),
                Decoder(echo_lm, tokenizer, fast=False, **kw),
            )
        fast.fast_engine.pipeline = True
        inside, longest = 0, 0
        for p, want in zip(prompts[:2], fast_refs["echo"][:2], strict=True):
            for case in (
                {"max_new_tokens": N, "eos_token_id": []},
                {"max_new_tokens": 7, "eos_token_id": []},
                {"max_new_tokens": 1, "eos_token_id": []},
                {"max_new_tokens": N, "eos_token_id": [want[9]]},
                {"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]},
            ):
                a, b = fast.generate(p, **case), ref.generate(p, **case)
                assert a.token_ids == b.token_ids, case
                assert _stats_key(a.stats) == _stats_key(b.stats), case
                assert a.stats.draft_passes == b.stats.draft_passes, case
                assert a.stats.fast["eager_cycles"] == 0, case
                if not case["eos_token_id"] and "stop" not in case:
                    assert a.token_ids == want[: case["max_new_tokens"]]
                inside += a.stats.committed_per_cycle[-1] > 1 and len(a.token_ids) < case["max_new_tokens"]
                longest = max(longest, *a.stats.committed_per_cycle)
        if (
            draft is echo_lm
        ):  # at K = 4 some cycle accepts the whole block: K + 1 tokens pending for the draft
            assert inside > 0 and longest >= 5, (inside, longest)


@pytest.mark.parametrize("k", [4, 16])
def test_greedy_asd_fast_path_equals_the_reference_loop(k, echo_lm, prompts, tokenizer, fast_refs):
    """Greedy asd on the fast path (sd's draft cycle with the ASD rule's twin, its regret budget carried across
    cycles on the device): the reference loop's tokens, and its per-cycle stats where no EOS cuts a draft, with a
    draft close to the target (mismatches of small regret: some accepted) under a budget that runs out within a
    request (0.2, at K = 4) and the default (8), with an EOS its drafts reach within a block. Fails if the spent regret is not carried from cycle to cycle or not
    reset per request, if the gate's K is not the reference's proposal length (a draft that reaches EOS stops
    there), or if the twin accepts other mismatches than the rule. Its budget-limited last cycles stay narrowed
    (its gate reads the block's K): fails if none runs eagerly."""
    from tests.decode.test_draft import perturbed

    draft = perturbed(echo_lm, 0.02, seed=8)
    relaxed, eager = 0, 0
    for budget in (0.2, 8.0) if k == 4 else (8.0,):
        kw = {"method": "asd", "draft": draft, "k": k, "budget": budget}
        fast, ref = (
            Decoder(echo_lm, tokenizer, fast=True, **kw),
            Decoder(echo_lm, tokenizer, fast=False, **kw),
        )
        fast.fast_engine.pipeline = True
        for p, want in zip(prompts[:2], fast_refs["echo"][:2], strict=True):
            own = ref.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids
            for case in (
                {"max_new_tokens": N, "eos_token_id": []},
                {"max_new_tokens": 7, "eos_token_id": []},
                {"max_new_tokens": N, "eos_token_id": [own[5]]},  # drafted early: a shorter gate K
                {"max_new_tokens": N, "eos_token_id": [], "stop": [tokenizer.decode(want[:7])[-2:]]},
            ):
                a, b = fast.generate(p, **case), ref.generate(p, **case)
                assert a.token_ids == b.token_ids, (budget, case)
                if not case["eos_token_id"]:
                    assert _stats_key(a.stats) == _stats_key(b.stats), (budget, case)
                relaxed += a.token_ids != want[: len(a.token_ids)]
                eager += a.stats.fast["eager_cycles"]
    assert relaxed > 0, "no mismatch was ever accepted: the test lost its point"
    assert eager > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ar", "unfused", "fused"])
def test_compile_true_runs_the_compiled_cycle_exactly_and_compiles_once(mode, echo_lm, tokenizer, prompts):
    """``compile=true``: the regular cycle through inductor (C++ kernels on the CPU). Fails if the flag does not
    reach the engine (nothing compiled), if a later request recompiles the cycle (a guard on something that
    changes per request: the prompt's length, the pending token, a Python int) or a view (bucket) compiles twice, or
    if the compiled cycle commits
    other tokens than the reference loop, EOS inside a block included (fp32: fused kernels round alike here)."""
    kw = (
        {"method": "ar"}
        if mode == "ar"
        else {"method": "prove-lossless", "block_size": 4, "fuse": mode == "fused", "fuse_groups": "all"}
    )
    dec = Decoder(echo_lm, tokenizer, fast=True, compile=True, **kw)
    ref = Decoder(echo_lm, tokenizer, fast=False, **kw)
    compiles = []
    for i, p in enumerate(prompts[:3]):
        want = ref.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids
        for eos in ([], [want[6]]):
            out = dec.generate(p, max_new_tokens=N, eos_token_id=eos)
            assert out.token_ids == ref.generate(p, max_new_tokens=N, eos_token_id=eos).token_ids, (i, eos)
            assert out.stats.fast["compiled"] == 1
            compiles.append(out.stats.fast["compiles"])
    assert compiles[0] >= 1 and compiles[1:] == [0] * (len(compiles) - 1), compiles
    assert dec.fast_engine.compile_s > 0
    # a request whose slots in use cross from the 64-slot view to the 128-slot one: one compile for the new view,
    # none when a request crosses it again (one compile per width and view)
    long = (prompts[3] * 2)[:60]
    crossed = [dec.generate(long, max_new_tokens=N, eos_token_id=[]) for _ in range(2)]
    assert crossed[0].token_ids == ref.generate(long, max_new_tokens=N, eos_token_id=[]).token_ids
    assert [c.stats.fast["compiles"] for c in crossed] == [1, 0] and dec.fast_engine.cache.view == 128


def test_a_request_past_the_default_cache_grows_it(make_lm, tokenizer, prompts):
    """The default cache (cache_len unset) grows to the next power of two for a request that needs more, and the
    tokens stay transformers' greedy ones; a cache_len the user fixed refuses under fast=true (above) and leaves
    the request to the reference loop under auto. Fails if a default Decoder refuses a request within the model's
    context, or if the grown cache keeps a graph or buffer of the old one."""
    import dataclasses

    model = make_lm(seed=7, std=0.12)
    model.config.max_position_embeddings = 80  # the default cache: min(80, 4096) slots
    dec = Decoder(
        model, tokenizer, method="prove-lossless", block_size=4, fuse=True, fuse_groups="all", fast=True
    )
    assert dec.fast_engine.capacity == 80 and dec.fast_engine.growable
    p = (prompts[3] * 2)[:70]
    out = dec.generate(p, max_new_tokens=10, eos_token_id=[])  # 80 positions, the tree's scratch past them
    assert out.token_ids == hf_generate(model, p, 10, suppress=mask_ids(tokenizer))
    assert out.stats.fast["grows"] == 1 and dec.fast_engine.capacity == 128
    again = dec.generate(p[:60], max_new_tokens=20, eos_token_id=[])
    assert again.token_ids == hf_generate(model, p[:60], 20, suppress=mask_ids(tokenizer))
    assert again.stats.fast["grows"] == 0
    fixed = Decoder(model, tokenizer, method="ar", fast=True, cache_len=12)
    fixed.params = dataclasses.replace(fixed.params, fast=None)  # auto (which a CPU never takes on its own)
    res = fixed.generate(prompts[0][:4], max_new_tokens=10, eos_token_id=[])
    assert res.stats.fast is None and res.token_ids == hf_generate(model, prompts[0][:4], 10)
