"""Our rules inside vLLM under load (``prove.decode.vllm.plugin.RuleScheduler``): with a KV cache too small for the
requests in flight, vLLM preempts requests and recomputes them; a resumed request still follows our rule (its last
committed token re-fed with the drafter's block after it), so every output of ``prove`` / ``asd`` is vLLM's first
token followed by our engine's output for the prompt extended by it, with our engine's stats; vLLM's own lossless
``prove-lossless`` (here under a K schedule too, through our drafter) gives our ``ar``'s tokens. The stats of a
request vLLM pads with placeholder drafts (a one-token prompt, a prefix-cache hit, beside running requests) equal our
engine's.

Three engines (``prove``, ``asd``, ``prove-lossless``), each started once, with a KV cache of 8 blocks of 32 tokens.
"""

from __future__ import annotations

import dataclasses

import pytest

vllm = pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")

from prove.decode import Decoder  # noqa: E402
from prove.decode.config import DecodeParams, VllmOptions  # noqa: E402
from prove.decode.vllm.backend import VllmDecoder  # noqa: E402

from tests.decode.vllm import test_vllm_rules as rules  # noqa: E402
from tests.decode.vllm.test_vllm_rules import K, assert_stats_equal_ours  # noqa: E402

ckpts = rules.ckpts  # the same tiny checkpoints (built again for this module)

pytestmark = pytest.mark.slow

N = 40
TINY_KV = VllmOptions(
    max_num_seqs=16, kv_cache_gb=256 * 2**10 / 2**30, max_model_len=128, engine_args={"block_size": 32}
)
"""256 KB of KV cache: 8 blocks of 32 tokens of the two tiny models (1 KB a token), against 16 requests of up to
~60 tokens (two blocks each)."""
TEXTS = [
    "Ana has 3 apples and buys 4 more.",
    "How many coins does Ben have?",
    "Cleo has 4 pens and gets 5 more.",
    "Dan reads 6 pages a day for 2 days.",
    "Eve had 9 stickers and gave away 3.",
    "Finn bakes 5 cakes and eats 1.",
    "Gus walks 2 miles then 7 more.",
    "Hana owns 8 books and sells 2.",
]


@pytest.fixture(scope="module")
def many(tokenizer) -> list[list[int]]:
    """16 prompts of 5-15 tokens."""
    out = [tokenizer(t)["input_ids"] for t in TEXTS]
    return out + [ids[: max(2, len(ids) // 2)] for ids in out]


def _engine(request, model, options=TINY_KV, **kw) -> VllmDecoder:
    dec = VllmDecoder(model, options=options, **kw)
    request.addfinalizer(dec.close)
    return dec


@pytest.fixture(scope="module")
def vllm_prove(request, ckpts):
    return _engine(request, ckpts["mars"], method="prove", verifier=ckpts["verifier-padded"])


SCHEDULE = [[1, 2, K], [3, 4, 2], [5, 256, 1]]
"""K by requests in flight for the engines under a K schedule: 4, 2, then 1 (prove, nsd, asd take K ≥ 1 only)."""


@pytest.fixture(scope="module")
def vllm_asd(request, ckpts):
    """ASD under preemption and a K schedule (its gate reads each block's K)."""
    options = dataclasses.replace(TINY_KV, k_schedule=SCHEDULE)
    return _engine(request, ckpts["mars"], method="asd", draft=ckpts["draft"], k=K, options=options)


def replayed(ours: Decoder, prompt: list[int], got, n: int = N):
    """Our engine's output for ``prompt`` extended by vLLM's first token, each cycle proposing no more than vLLM's
    step verified (``proposed_per_cycle``: the K its schedule gave the step, cut as our proposer cuts)."""
    ks = iter(got.stats.proposed_per_cycle)
    proposer = ours.proposer
    proposer.propose = lambda seq, budget: type(proposer).propose(
        proposer, seq, min(budget, next(ks, budget))
    )
    try:  # on_cycle: the reference loop, where the proposer is called each cycle
        return ours.generate(list(prompt) + got.token_ids[:1], max_new_tokens=n - 1, on_cycle=lambda e: None)
    finally:
        del proposer.propose


def test_prove_under_preemption_follows_our_rule(vllm_prove, ckpts, many):
    """All 16 at once through a cache of a few sequences: vLLM preempts (counted), and each output is still its first
    token followed by our engine's ``prove``. Fails if a resumed request's prefill samples the verifier's token (the
    plugin without its scheduler), or if the drafts re-fed on resume are not the block after the last token."""
    ours = Decoder(ckpts["mars"], method="prove", verifier=ckpts["verifier"], theta=3e-4)
    before = vllm_prove.preemptions()
    got = dict(vllm_prove.generate_many(many, N, sampling=DecodeParams(theta=3e-4)))
    assert vllm_prove.preemptions() > before
    for i, p in enumerate(many):
        want = ours.generate(list(p) + got[i].token_ids[:1], max_new_tokens=N - 1)
        assert got[i].token_ids == got[i].token_ids[:1] + want.token_ids, i
        assert_stats_equal_ours(got[i], want)  # the resumed prefill is no cycle of its own


def test_asd_under_preemption_and_a_k_schedule_follows_our_rule(vllm_asd, ckpts, many):
    """As above for ASD, whose regret budget is kept per request across its preemption, under a K schedule: each
    output equals our engine's run with the same K each cycle (``replayed``). Fails if a scheduled step's K does not
    reach our rule as its block size (ASD's gate), if the stats do not record the K of each step, or if a K = 1 step
    is mishandled."""
    ref = Decoder(ckpts["mars"], method="asd", draft=ckpts["draft"], k=K)
    before = vllm_asd.preemptions()
    got = dict(vllm_asd.generate_many(many, N))
    assert vllm_asd.preemptions() > before
    for i, p in enumerate(many):
        want = replayed(ref, p, got[i])
        assert got[i].token_ids == got[i].token_ids[:1] + want.token_ids, i
        assert_stats_equal_ours(got[i], want)
    ks = {k for r in got.values() for k in r.stats.proposed_per_cycle[:-1]}
    assert {1, 2, K} <= ks, ks  # the schedule ran at every K


def test_prove_under_a_k_schedule_replays_to_ours(request, ckpts, many):
    """``prove`` with a K schedule (4 up to 2 requests in flight, 2 up to 4, 1 past), 16 requests through the small
    cache: each output is its first token followed by our engine's ``prove`` run with the K of each of vLLM's steps,
    with its stats. Fails if the drafter's slots do not follow the step's K (drafts land on other requests: the
    sampler's p̃ check ends them), if p̃ is kept for the wrong rows, or if a K = 0 entry is let through (the
    verifier's own token would be committed)."""
    options = dataclasses.replace(TINY_KV, k_schedule=SCHEDULE)
    dec = _engine(request, ckpts["mars"], method="prove", verifier=ckpts["verifier-padded"], options=options)
    ours = Decoder(ckpts["mars"], method="prove", verifier=ckpts["verifier"], theta=3e-4)
    got = dict(dec.generate_many(many, N, sampling=DecodeParams(theta=3e-4)))
    assert dec.preemptions() > 0
    for i, p in enumerate(many):
        want = replayed(ours, p, got[i])
        assert got[i].token_ids == got[i].token_ids[:1] + want.token_ids, i
        assert_stats_equal_ours(got[i], want)
    ks = {k for r in got.values() for k in r.stats.proposed_per_cycle[:-1]}
    assert {1, 2, K} <= ks, ks
    with pytest.raises(ValueError, match="K ≥ 1 only"):
        VllmDecoder(ckpts["mars"], method="prove", verifier=ckpts["verifier-padded"], start=False,
                    options=dataclasses.replace(TINY_KV, k_schedule=[[1, 2, K], [3, 256, 0]]))  # fmt: skip


def test_padded_steps_leave_no_phantom_cycle(vllm_prove, ckpts, many, tokenizer):
    """A one-token prompt and a repeated prompt of 33 tokens (a prefix-cache hit of one 32-token block leaves one
    token) arrive beside running requests: vLLM schedules each as a decode padded with K placeholder drafts and
    records K drafted, 0 accepted; the stats still equal our engine's (no phantom cycle, no depth-1 acceptance for a
    step without a draft). Fails if the padded step is counted as a drafting step."""
    ours = Decoder(ckpts["mars"], method="prove", verifier=ckpts["verifier"], theta=3e-4)
    sampling = DecodeParams(theta=3e-4)
    text = " ".join(TEXTS)
    long = tokenizer(text)["input_ids"][:33]
    assert len(long) == 33
    dict(vllm_prove.generate_many([long], 4, sampling=sampling))  # its first block now cached
    special = {4: long, 6: many[0][:1]}
    queue = [*many[:4], long, many[4], many[0][:1], *many[5:8]]
    got = dict(vllm_prove.generate_many(queue, N, sampling=sampling, concurrency=4))
    for i in special:
        want = ours.generate(list(queue[i]) + got[i].token_ids[:1], max_new_tokens=N - 1)
        assert got[i].token_ids[1:] == want.token_ids, i
        assert_stats_equal_ours(got[i], want)
    for i, p in enumerate(queue):
        want = ours.generate(list(p) + got[i].token_ids[:1], max_new_tokens=N - 1)
        assert_stats_equal_ours(got[i], want)


def test_a_request_the_rule_cannot_serve_finishes_alone_with_an_error(vllm_prove, many):
    """Requests sent past our checks (``vllm.LLM`` directly) that sample, or carry a θ the method refuses, beside valid
    ones: each bad one finishes on arrival with vLLM's error finish reason and no token; the others are answered as
    alone, and the engine serves on. Fails if a bad request ends as ``stop`` (the sampler's stop-token fallback) or
    takes the engine down."""
    from vllm import SamplingParams

    good = vllm_prove.sampling_params(N, None, vllm_prove.eos_ids(), None, DecodeParams(theta=3e-4))
    extra = good.extra_args
    bad = [
        SamplingParams(max_tokens=N, temperature=0.7, extra_args=extra),
        SamplingParams(max_tokens=N, temperature=0.0, extra_args={**extra, "theta": -1.0}),
    ]
    prompts = [{"prompt_token_ids": list(p)} for p in many[:3]]
    outs = vllm_prove.llm.generate(prompts, [bad[0], good, bad[1]], use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["error", outs[1].outputs[0].finish_reason, "error"]
    assert outs[1].outputs[0].finish_reason in ("stop", "length") and not outs[0].outputs[0].token_ids
    ((_, alone),) = vllm_prove.generate_many([many[1]], N, sampling=DecodeParams(theta=3e-4))
    assert list(outs[1].outputs[0].token_ids) == alone.token_ids


def test_prove_lossless_under_preemption_and_a_k_schedule(request, ckpts, many):
    """vLLM's prove-lossless (the MARS checkpoint drafting for itself) with a K schedule of 4 up to 2 requests in
    flight, 2 from 3 and 0 from 6 (``vllm.k_schedule``), 16 requests at once through the small cache (preemptions
    counted): the outputs are our ``ar``'s token for token, the drafter skips its pass at K = 0 and re-feeds what it
    missed, and position 1 of a self-draft (the model's own next token) is accepted on nearly every drafting step, at
    K = 2 and after steps at K = 0 too. Fails on a resumed request that leaves AR; with vLLM's own parallel drafter,
    whose K = 4 slots a request reshaped into rows of 2 hand request j the drafts of another (position 1 then mostly
    rejected); if a K = 0 step runs the drafter's pass; and if the tokens of skipped steps are not re-fed, or at the
    wrong positions (the drafter then drafts over stale KV and position 1 is often rejected)."""
    mars = ckpts["mars"]
    options = dataclasses.replace(TINY_KV, k_schedule=[[1, 2, K], [3, 5, 2], [6, 256, 0]])
    dec = VllmDecoder(mars, method="prove-lossless", options=options)
    request.addfinalizer(dec.close)
    assert dec.engine_args["worker_cls"].endswith("RuleCPUWorker")  # our drafter
    got = dict(dec.generate_many(many, N))
    assert dec.preemptions() > 0
    ar = Decoder(mars, method="ar")
    for i, p in enumerate(many):
        assert got[i].token_ids == ar.generate(p, max_new_tokens=N).token_ids, i
    stats = [r.stats for r in got.values()]
    drafted, accepted = sum(s.proposed_by_depth[0] for s in stats), sum(s.accepted_by_depth[0] for s in stats)
    assert drafted > 16 and accepted >= 0.9 * drafted, (accepted, drafted)
    (counts,) = dec.llm.collective_rpc("drafter_counts")
    assert counts["skipped"] > 0 and counts["refed"] > 0 and counts["passes"] > 0, counts
    assert sum(s.draft_tokens for s in stats) < K * sum(s.drafts for s in stats)  # steps at K = 2 ran
