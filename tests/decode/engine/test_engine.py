"""The cycle engine on tiny random models: lossless equivalence with transformers' greedy generate, the
θ / τ limits of the block rules, EOS / stop / max_new_tokens inside a block, and the KV-cache invariant."""

from __future__ import annotations

import copy

import pytest
import torch
from prove.decode import Decoder
from prove.decode.engine.cache import linear_mask
from prove.decode.methods import Method, get_method
from prove.decode.proposers import Proposal

from tests.decode.decode_helpers import hf_generate, mask_ids
from tests.numerics import assert_caches_match, assert_logits_match

# In-memory models have no prove.json: the Decoder warns that it takes block_size as given.
pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

LENGTHS = (1, 9, 40)


@pytest.fixture(scope="module")
def refs(lm, prompts, tokenizer):
    """transformers' greedy continuation of every prompt (no EOS), 40 tokens."""
    return [hf_generate(lm, p, max(LENGTHS), suppress=mask_ids(tokenizer)) for p in prompts]


def no_eos(dec: Decoder, prompt, n: int, **kw):
    return dec.generate(prompt, max_new_tokens=n, eos_token_id=[], **kw)


class ScriptedProposer:
    """Proposes the true greedy continuation ``ref``, corrupting the tokens at ``wrong`` (indices into the
    new tokens): a high-acceptance proposer with a few forced rejections."""

    def __init__(self, prompt_len: int, ref: list[int], wrong: set[int], block_size: int, vocab: int):
        self.prompt_len, self.ref, self.wrong, self.k, self.vocab = prompt_len, ref, wrong, block_size, vocab

    def propose(self, seq, budget):
        at = len(seq) - self.prompt_len
        toks = []
        for j in range(at, at + min(self.k, budget)):
            t = self.ref[j] if j < len(self.ref) else 0
            toks.append((t + 1) % self.vocab if j in self.wrong else t)
        tokens = torch.tensor(toks, dtype=torch.long)
        return Proposal(tokens=tokens, conf=torch.ones(len(toks)))


def scripted(prompt_len, ref, wrong, block_size, vocab) -> Method:
    base = get_method("prove-lossless")
    return Method(
        "scripted-lossless",
        proposer=lambda models, params, gen: ScriptedProposer(prompt_len, ref, wrong, block_size, vocab),
        verifier="self",
        accept=base.accept,
    )


@pytest.mark.parametrize("k", [1, 2, 4, 16])
def test_prove_lossless_equals_hf_generate(lm, tokenizer, prompts, refs, k):
    dec = Decoder(lm, tokenizer, method="prove-lossless", block_size=k)
    for p, ref in zip(prompts, refs, strict=True):
        for n in LENGTHS:
            out = no_eos(dec, p, n)
            assert out.token_ids == ref[:n], (k, n)
            s = out.stats
            assert s.new_tokens == n == sum(s.committed_per_cycle)
            # a block pass + a verify pass per cycle; only a last cycle with one token of budget left
            # proposes nothing and is a single AR step
            proposed = s.proposed_by_depth[0] if s.proposed_by_depth else 0
            assert s.cycles - 1 <= proposed <= s.cycles
            assert s.model_passes == s.cycles + proposed and s.verifier_passes == 0 == s.draft_passes


def test_ar_equals_hf_generate(lm, tokenizer, prompts, refs):
    dec = Decoder(lm, tokenizer, method="ar")
    for p, ref in zip(prompts, refs, strict=True):
        for n in LENGTHS:
            out = no_eos(dec, p, n)
            assert out.token_ids == ref[:n]
            assert out.stats.cycles == out.stats.model_passes == n
            assert out.stats.tokens_per_cycle == 1.0


def test_random_block_proposer_gives_partial_acceptance(lm, tokenizer, prompts, refs):
    """An untrained block proposer: y_1 (exact next-token prediction) is always accepted, later ones rarely."""
    out = no_eos(Decoder(lm, tokenizer, method="prove-lossless", block_size=4), prompts[0], 40)
    s = out.stats
    assert s.accepted_by_depth[0] == s.cycles  # y_1 is the model's own greedy token
    assert 1 < s.tokens_per_cycle < 4
    assert any(c < 4 for c in s.committed_per_cycle)


@pytest.mark.parametrize("k", [1, 2, 4, 16])
def test_high_acceptance_scripted_proposer_stays_lossless(lm, tokenizer, prompts, refs, k):
    for p, ref in zip(prompts, refs, strict=True):
        wrong = {3, 4, 11, 25}
        dec = Decoder(lm, tokenizer, method=scripted(len(p), ref, wrong, k, len(tokenizer)))
        out = no_eos(dec, p, 40)
        assert out.token_ids == ref
        if k == 16:
            assert out.stats.committed_per_cycle[:2] == [
                4,
                1,
            ]  # y_1..y_3 + correction; then y_5 is wrong again
            assert out.stats.tokens_per_cycle > 5
    p, ref = prompts[0], refs[0]
    perfect = no_eos(Decoder(lm, tokenizer, method=scripted(len(p), ref, set(), k, len(tokenizer))), p, 40)
    assert perfect.token_ids == ref
    assert perfect.stats.committed_per_cycle[0] == k + 1  # a whole block plus the bonus token


def _first_new_token_at(ref: list[int], lo: int) -> int:
    return next(i for i in range(lo, len(ref)) if ref[i] not in ref[:i])


@pytest.mark.parametrize("method", ["scripted", "prove-lossless", "ar"])
def test_eos_inside_a_block_ends_where_ar_does(lm, tokenizer, prompts, refs, method):
    p, ref = prompts[1], refs[1]
    e = _first_new_token_at(ref, 5)
    eos = ref[e]
    expected = hf_generate(lm, p, 40, eos=eos, suppress=mask_ids(tokenizer))
    assert expected == ref[: e + 1]
    m = scripted(len(p), ref, set(), 16, len(tokenizer)) if method == "scripted" else method
    dec = Decoder(lm, tokenizer, method=m, **({"block_size": 16} if method == "prove-lossless" else {}))
    out = dec.generate(p, max_new_tokens=40, eos_token_id=eos)
    assert out.token_ids == expected
    assert out.stats.new_tokens == e + 1


@pytest.mark.parametrize("n", [1, 7, 17])
def test_max_new_tokens_inside_a_block(lm, tokenizer, prompts, refs, n):
    p, ref = prompts[0], refs[0]
    dec = Decoder(lm, tokenizer, method=scripted(len(p), ref, {9}, 16, len(tokenizer)))
    out = no_eos(dec, p, n)
    assert out.token_ids == ref[:n] == hf_generate(lm, p, n, suppress=mask_ids(tokenizer))


def test_stop_string_inside_a_block_ends_where_ar_does(lm, tokenizer, prompts, refs):
    p, ref = prompts[0], refs[0]
    stop = tokenizer.decode(ref[12:14])
    j = next(i for i in range(len(ref)) if stop in tokenizer.decode(ref[: i + 1]))
    ar = no_eos(Decoder(lm, tokenizer, method="ar"), p, 40, stop=[stop])
    block = no_eos(
        Decoder(lm, tokenizer, method=scripted(len(p), ref, set(), 16, len(tokenizer))), p, 40, stop=[stop]
    )
    assert ar.token_ids == block.token_ids == ref[: j + 1]


def test_prove_theta_zero_commits_whole_blocks(lm, small, tokenizer, prompts):
    blocks: list[list[int]] = []
    dec = Decoder(lm, tokenizer, method="prove", verifier=small, theta=0.0, block_size=4)
    out = no_eos(dec, prompts[0], 18, on_cycle=lambda ev: blocks.append(ev.proposal.tokens.tolist()))
    assert out.stats.committed_per_cycle == [4, 4, 4, 4, 2]
    assert out.token_ids == sum(blocks, [])[:18]
    assert out.stats.verifier_passes == out.stats.cycles


def test_prove_theta_one_is_mars_tau_above_one_is_ar(lm, small, tokenizer, prompts, refs):
    """θ = 1 (the largest θ allowed) accepts only y_1 unless p̃ = q = 1 exactly, as τ > 1 does MARS."""
    for p, ref in zip(prompts, refs, strict=True):
        prove = no_eos(Decoder(lm, tokenizer, method="prove", verifier=small, theta=1.0, block_size=4), p, 20)
        mars = no_eos(Decoder(lm, tokenizer, method="mars", tau=1.01, block_size=4), p, 20)
        assert prove.token_ids == mars.token_ids == ref[:20]
        assert prove.stats.cycles == mars.stats.cycles == 20


def test_mars_tau_zero_commits_whole_blocks(lm, tokenizer, prompts):
    out = no_eos(Decoder(lm, tokenizer, method="mars", tau=0.0, block_size=4), prompts[2], 10)
    assert out.stats.committed_per_cycle == [4, 4, 2]
    assert out.stats.verifier_passes == 0 and out.stats.model_passes == 3


def _check_cache(runner, seq: list[int]) -> None:
    """The runner's cache equals a fresh forward over the committed prefix it claims to hold."""
    model, valid = runner.model, runner.valid
    assert runner.cached == len(runner.fed) == valid <= len(seq)
    assert runner.fed == seq[:valid]
    kw = "past_key_values"
    fresh = getattr(model(torch.tensor([seq[:valid]]), use_cache=True), kw)
    assert_caches_match(runner.cache.layers, fresh.layers, runner.model)
    if valid < len(seq):  # continuing from the cache gives the logits of a fresh full forward
        cache = copy.deepcopy(
            runner.cache
        )  # continued at the slots after the valid prefix, seeing exactly those
        pos = torch.arange(valid, len(seq))
        cache.set_slots(pos)
        cache.view, cache.length = len(seq), valid
        mask = linear_mask(pos[0], len(pos), len(seq), torch.float32)
        cont = model(
            torch.tensor([seq[valid:]]),
            **{kw: cache},
            position_ids=pos[None],
            attention_mask=mask,
            use_cache=True,
        ).logits
        full = model(torch.tensor([seq])).logits
        assert_logits_match(cont[0, -1], full[0, -1], model)


@pytest.mark.parametrize("method", ["ar", "mars", "prove", "prove-lossless"])
def test_caches_hold_exactly_the_committed_prefix_after_every_cycle(lm, small, tokenizer, prompts, method):
    pending: list[int] = []

    def check(ev):
        for runner in ev.models.runners():
            _check_cache(runner, ev.seq)
        pending.append(len(ev.seq) - ev.models.target.valid)

    kw = {"verifier": small, "theta": 0.01} if method == "prove" else {"tau": 0.3} if method == "mars" else {}
    if method != "ar":
        kw["block_size"] = 4
    dec = Decoder(lm, tokenizer, method=method, **kw)
    with torch.no_grad():
        out = no_eos(dec, prompts[3], 24, on_cycle=check)
    assert len(pending) == out.stats.cycles
    if method in ("ar", "prove-lossless"):
        assert set(pending) == {1}  # only the correction / bonus token waits for the next pass
    else:
        assert pending == out.stats.committed_per_cycle  # block-pass KV came from placeholders: re-fed


def test_trace_records_positions_without_changing_the_output(lm, small, tokenizer, prompts, refs):
    dec = Decoder(lm, tokenizer, method="prove-lossless", verifier=small, trace=True, block_size=4)
    out = no_eos(dec, prompts[0], 30)
    assert out.token_ids == refs[0][:30]
    trace = out.stats.trace
    assert trace is not None and len(trace) == out.stats.cycles
    for row in trace:
        k = len(row["tokens"])
        assert (
            len(row["conf"])
            == len(row["verifier_prob"])
            == len(row["target_prob"])
            == len(row["matched"])
            == k
        )
        assert row["matched"][0] is True  # y_1 is the exact greedy token
        assert row["accepted"] == next((i for i, m in enumerate(row["matched"]) if not m), k)
    assert out.stats.verifier_passes == out.stats.cycles
    assert "trace" not in no_eos(Decoder(lm, tokenizer, method="ar"), prompts[0], 3).stats.to_dict()


def test_sampling_is_seeded_and_lossless_methods_refuse_it(lm, tokenizer, prompts):
    dec = Decoder(lm, tokenizer, method="ar", temperature=1.0, top_k=50)
    a = no_eos(dec, prompts[0], 20, seed=1).token_ids
    assert a == no_eos(dec, prompts[0], 20, seed=1).token_ids
    assert a != no_eos(dec, prompts[0], 20, seed=2).token_ids
    mars = Decoder(lm, tokenizer, method="mars", temperature=1.0, block_size=4, seed=3)
    assert no_eos(mars, prompts[0], 12).stats.new_tokens == 12
    with pytest.raises(ValueError, match="set temperature=0"):
        Decoder(lm, tokenizer, method="prove-lossless", temperature=0.7, block_size=4)


def test_prompt_forms_agree(lm, tokenizer):
    dec = Decoder(lm, tokenizer, method="ar")
    messages = [{"role": "user", "content": "Fay has 2 books"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    outs = [no_eos(dec, x, 5).token_ids for x in (messages, ids, torch.tensor(ids))]
    assert outs[0] == outs[1] == outs[2]
    assert no_eos(dec, "Ana has", 3).text == tokenizer.decode(no_eos(dec, "Ana has", 3).token_ids)


def test_stats_is_a_dataclass_with_to_dict(lm, tokenizer, prompts):
    """One interface: attributes, and ``to_dict`` for records (no fake-mapping ``keys`` / ``__getitem__``)."""
    stats = no_eos(Decoder(lm, tokenizer, method="ar"), prompts[0], 3).stats
    assert stats.to_dict()["new_tokens"] == stats.new_tokens == 3
    assert "trace" not in stats.to_dict()
    with pytest.raises(TypeError):
        stats["new_tokens"]  # type: ignore[index]


def test_model_time_is_the_requests_passes_and_no_more(lm, small, tokenizer, prompts):
    """``Stats.model_s`` holds this request's time inside model passes (every model's): a pass made 20 ms
    slower adds 20 ms per pass to it, the same decode run again counts only its own passes, and the rest of
    ``wall_s`` is the engine's."""
    import time

    slow, slow_small = copy.deepcopy(lm), copy.deepcopy(small)
    for m in (slow, slow_small):
        m.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    dec = Decoder(slow, tokenizer, method="prove", verifier=slow_small, block_size=4)
    for _ in range(2):
        s = no_eos(dec, prompts[0], 6).stats
        assert s.model_passes >= 2 and s.verifier_passes >= 1
        assert 0.02 * (s.model_passes + s.verifier_passes) <= s.model_s < s.wall_s


def _widths(model) -> tuple[list[int], object]:
    """The number of tokens each forward of ``model`` feeds, from now on (remove the returned hook after)."""
    widths: list[int] = []

    def record(_module, args, kwargs) -> None:
        widths.append((args[0] if args else kwargs["input_ids"]).shape[1])

    return widths, model.register_forward_pre_hook(record, with_kwargs=True)


def test_a_pass_after_seq_was_fed_reuses_the_row_after_it(lm, prompts):
    """A self-verification right after the block pass feeds only the drafts (the block pass already gave the
    logits after the pending token): logits equal a fresh runner's pass that re-feeds it. A sequence whose last
    token the cache did not see, or one past the last pass's rows, is re-fed."""
    from prove.decode.engine import ModelRunner

    seq, masks, drafts = list(prompts[1]), [7] * 3, [11, 12, 13, 14]
    corr = seq + [11, 99]  # the second draft rejected, a correction the cache never saw: re-fed
    nxt = corr + [5]  # its next pass fed [99, 5]: the row after 5 is known
    steps = [(seq, masks, None), (seq, drafts, 4), (corr, [5], 2), (nxt, [21, 22], 2), (nxt + [21], [8], 1)]
    fresh = [ModelRunner(lm).forward(s, e) for s, e, _ in steps]
    runner = ModelRunner(lm)
    widths, handle = _widths(lm)
    try:
        for (s, e, width), ref in zip(steps, fresh, strict=True):
            assert_logits_match(runner.forward(s, e), ref, lm)
            assert width is None or widths[-1] == width
            assert runner.fed[: len(s)] == s and runner.fed[len(s) :] == e
    finally:
        handle.remove()


@pytest.mark.parametrize("method", ["prove-lossless", "prove"])
def test_verify_passes_feed_only_the_proposal(lm, small, tokenizer, prompts, refs, method):
    """prove-lossless's self-verification reads K tokens, not K + 1 (the block pass fed the pending token); prove's
    verifier, after a cycle that committed drafts only, feeds the next block alone. Greedy output is unchanged."""
    k = 4
    kw = {"verifier": small, "theta": 0.0} if method == "prove" else {}
    dec = Decoder(lm, tokenizer, method=method, block_size=k, **kw)
    target = small if method == "prove" else lm
    widths, handle = _widths(target)
    try:
        out = no_eos(dec, prompts[2], 20)
    finally:
        handle.remove()
    # the prompt's pass is the first block pass; the last cycle's budget may cut its block short
    verify = widths[1::2] if method == "prove-lossless" else widths[1:]
    assert len(verify) >= 3 and set(verify[:-1]) == {k} and verify[-1] <= k, widths
    if method == "prove-lossless":
        assert out.token_ids == refs[2][:20]
