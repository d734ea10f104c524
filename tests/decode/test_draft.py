"""The speculative-decoding family on the engine: the draft proposer (k sequential passes, its own
rolled-back DynamicCache) with the sd / nsd / asd rules, on tiny random Qwen2 models.

Greedy sd, nsd with θ = 0 and asd with B = 0 must equal transformers' greedy ``generate`` token for token
— with a draft equal to the target (everything accepted), a random draft (almost nothing) and a partly
right one, EOS and max_new_tokens falling inside a block — and transformers' assisted generation.
"""

from __future__ import annotations

import copy

import pytest
import torch
from prove.decode import Decoder
from prove.decode.engine import ModelRunner
from prove.decode.methods import get_method
from prove.decode.proposers.draft import DraftProposer
from prove.decode.rules.speculative import AsdState, asd_greedy

from tests.decode.decode_helpers import hf_generate, mask_ids
from tests.numerics import assert_caches_match

# In-memory models have no prove.json: block methods warn that they take block_size as given.
pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

K = 5
N = 24


def perturbed(model: torch.nn.Module, std: float, seed: int) -> torch.nn.Module:
    """The target with Gaussian noise on every weight matrix: a draft that is partly right."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * std)
    return draft


@pytest.fixture(scope="module")
def drafts(lm, make_lm):
    return {"equal": copy.deepcopy(lm), "random": make_lm(seed=7), "partly": perturbed(lm, 0.006, seed=8)}


@pytest.fixture(scope="module")
def refs(lm, prompts, tokenizer):
    return [hf_generate(lm, p, N, suppress=mask_ids(tokenizer)) for p in prompts]


def greedy_decoders(lm, tokenizer, draft) -> dict[str, Decoder]:
    return {
        "sd": Decoder(lm, tokenizer, method="sd", draft=draft),
        "nsd θ=0": Decoder(lm, tokenizer, method="nsd", draft=draft, theta=0.0),
        "asd B=0": Decoder(lm, tokenizer, method="asd", draft=draft, budget=0.0),
    }


@pytest.mark.parametrize("kind", ["equal", "random", "partly"])
def test_greedy_family_equals_hf_greedy(lm, tokenizer, prompts, refs, drafts, kind):
    proposed = accepted = 0
    for name, dec in greedy_decoders(lm, tokenizer, drafts[kind]).items():
        for i, n in [(0, N), (3, N), (0, 3), (3, 9)]:  # 3 and 9 end inside a k = 5 block
            out = dec.generate(prompts[i], max_new_tokens=n, eos_token_id=[])
            assert out.token_ids == refs[i][:n], (name, kind, i, n)
            s = out.stats
            assert s.new_tokens == sum(s.committed_per_cycle) == n
            assert s.model_passes == s.cycles and s.verifier_passes == 0
            # the last cycle proposes only what the budget can still take (budget − 1)
            assert s.draft_passes == sum(s.proposed_by_depth) <= K * s.cycles
            proposed, accepted = proposed + sum(s.proposed_by_depth), accepted + sum(s.accepted_by_depth)
    rate = accepted / proposed
    if kind == "equal":
        assert rate == 1.0  # every proposed token accepted: k + 1 tokens per target pass
    elif kind == "random":
        assert rate < 0.1
    else:
        assert 0.2 < rate < 0.9, rate


def test_draft_equal_to_target_commits_k_plus_one_per_cycle(lm, tokenizer, prompts, drafts):
    out = Decoder(lm, tokenizer, method="sd", draft=drafts["equal"]).generate(
        prompts[0], max_new_tokens=3 * (K + 1) + 2, eos_token_id=[]
    )
    assert out.stats.committed_per_cycle == [K + 1] * 3 + [2]
    assert out.stats.draft_passes == 3 * K + 1


@pytest.mark.parametrize("kind", ["equal", "partly"])
def test_eos_inside_a_block_ends_where_hf_does(lm, tokenizer, prompts, refs, drafts, kind):
    p, ref = prompts[1], refs[1]
    e = next(i for i in range(7, len(ref)) if ref[i] not in ref[:i])  # first occurrence, mid-output
    expected = hf_generate(lm, p, N, eos=ref[e], suppress=mask_ids(tokenizer))
    assert expected == ref[: e + 1]
    for name, dec in greedy_decoders(lm, tokenizer, drafts[kind]).items():
        assert dec.generate(p, max_new_tokens=N, eos_token_id=ref[e]).token_ids == expected, name


def test_drafting_stops_at_eos(lm, tokenizer, prompts, refs, drafts):
    """A draft never proposes past an EOS (nothing after it can be committed): old code drafted all k."""
    p, ref = prompts[1], refs[1]
    # an EOS in the middle of a proposal: cycles commit K + 1 tokens, so position e is y_{e mod (K+1) + 1}
    e = next(i for i in range(7, len(ref)) if ref[i] not in ref[:i] and i % (K + 1) < K - 1)
    proposals: list[list[int]] = []
    dec = Decoder(lm, tokenizer, method="sd", draft=drafts["equal"])
    out = dec.generate(
        p,
        max_new_tokens=N,
        eos_token_id=ref[e],
        on_cycle=lambda ev: proposals.append(ev.proposal.tokens.tolist()),
    )
    assert out.token_ids == ref[: e + 1]
    assert ref[e] in proposals[-1] and proposals[-1][-1] == ref[e], proposals
    assert all(ref[e] not in block[:-1] for block in proposals)
    assert out.stats.draft_passes == sum(len(b) for b in proposals) < K * len(proposals)


@pytest.mark.parametrize("kind", ["equal", "random", "partly"])
def test_greedy_sd_equals_hf_assisted_generation(lm, tokenizer, prompts, drafts, kind):
    draft = copy.deepcopy(drafts[kind])  # assisted generation writes into the draft's generation_config
    dec = Decoder(lm, tokenizer, method="sd", draft=drafts[kind], k=K)
    for p in (prompts[0], prompts[3]):
        ours = dec.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids
        assert ours == hf_generate(
            lm, p, N, assistant=draft, assistant_tokens=K, suppress=mask_ids(tokenizer)
        )


def _check_draft_cache(runner, seq: list[int]) -> None:
    """After a cycle the draft's cache holds exactly a committed prefix, with the KV of a fresh forward."""
    valid = runner.valid
    assert runner.cached == len(runner.fed) == valid <= len(seq) and runner.fed == seq[:valid]
    fresh = runner.model(torch.tensor([seq[:valid]]), use_cache=True).past_key_values
    assert_caches_match(runner.cache.layers, fresh.layers, runner.model)


@pytest.mark.parametrize("kind", ["equal", "partly"])
def test_draft_cache_is_rolled_back_to_the_committed_prefix(lm, tokenizer, prompts, drafts, kind):
    lag: list[int] = []

    def check(ev):
        _check_draft_cache(ev.models.draft, ev.seq)
        if ev.proposal.k:  # a last cycle with budget 1 proposes nothing and leaves the draft idle
            lag.append(len(ev.seq) - ev.models.draft.valid)

    Decoder(lm, tokenizer, method="sd", draft=drafts[kind]).generate(
        prompts[3], max_new_tokens=30, eos_token_id=[], on_cycle=check
    )
    # after a draft pass, never more than the unfed y_k and the correction/bonus token are left over
    assert max(lag) <= 2 and (kind != "equal" or lag[0] == 2)


def test_draft_vocab_rows_are_fitted_to_the_target(lm, tokenizer, prompts, refs, make_lm):
    """A draft with more logit rows than the target is cut to the target's vocabulary (output stays
    greedy); one with fewer is padded with zero probability."""
    big = make_lm(seed=9, vocab=len(tokenizer) + 20)
    out = Decoder(lm, tokenizer, method="sd", draft=big).generate(
        prompts[0], max_new_tokens=N, eos_token_id=[]
    )
    assert out.token_ids == refs[0]
    prop = DraftProposer(ModelRunner(lm), 3, vocab_size=len(tokenizer) + 20, temperature=1.0)
    proposal = prop.propose(prompts[0], budget=10)
    assert proposal.probs.shape == (3, len(tokenizer) + 20) and torch.all(proposal.probs[:, -20:] == 0)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))


# -- sampling -----------------------------------------------------------------------------------------------


def test_sampling_sd_is_seeded_and_nsd_theta_zero_is_sd(lm, tokenizer, prompts, drafts):
    kw = {"draft": drafts["partly"], "temperature": 0.9, "top_k": 50, "top_p": 0.95}
    sd = Decoder(lm, tokenizer, method="sd", **kw)
    nsd0 = Decoder(lm, tokenizer, method="nsd", theta=0.0, **kw)
    a = sd.generate(prompts[0], max_new_tokens=N, eos_token_id=[], seed=3)
    b = sd.generate(prompts[0], max_new_tokens=N, eos_token_id=[], seed=3)
    c = nsd0.generate(prompts[0], max_new_tokens=N, eos_token_id=[], seed=3)  # same random numbers
    d = sd.generate(prompts[0], max_new_tokens=N, eos_token_id=[], seed=4)
    assert a.token_ids == b.token_ids == c.token_ids != d.token_ids
    assert a.stats.committed_per_cycle == c.stats.committed_per_cycle
    # a wider nucleus accepts at least as much on average (not per request: the streams diverge)
    wide = Decoder(lm, tokenizer, method="nsd", theta=0.95, **kw)
    acc = [
        sum(dec.generate(p, max_new_tokens=N, eos_token_id=[], seed=s).stats.accepted_by_depth)
        for dec in (sd, wide)
        for p in prompts
        for s in range(2)
    ]
    assert sum(acc[len(acc) // 2 :]) > sum(acc[: len(acc) // 2])


def test_sampling_sd_with_draft_equal_to_target_accepts_everything(lm, tokenizer, prompts, drafts):
    dec = Decoder(lm, tokenizer, method="sd", draft=drafts["equal"], temperature=1.0)
    s = dec.generate(prompts[2], max_new_tokens=N, eos_token_id=[], seed=0).stats
    # p == q up to float error between one- and multi-token passes: min(1, p/q) ≈ 1
    assert sum(s.accepted_by_depth) >= 0.97 * sum(s.proposed_by_depth)


def test_budget_of_one_proposes_nothing(lm, tokenizer, prompts, refs, drafts):
    """With one token left the draft stays idle: the cycle is a plain target step (greedy or sampled)."""
    for temperature in (0.0, 1.0):
        dec = Decoder(lm, tokenizer, method="sd", draft=drafts["random"], temperature=temperature)
        out = dec.generate(prompts[0], max_new_tokens=1, eos_token_id=[], seed=0)
        assert out.stats.draft_passes == 0 and out.stats.model_passes == 1 and len(out.token_ids) == 1
        assert temperature > 0 or out.token_ids == refs[0][:1]


# -- draft length: draft_threshold ------------------------------------------------------------------------------


def _proposals(
    dec: Decoder, prompt: list[int], n: int
) -> tuple[list[int], list[tuple[list[float], int]], int]:
    """The output, each cycle's (p̃ of its proposal, the cycle's budget), and the draft passes."""
    seen: list[tuple[list[float], int]] = []

    def record(ev):
        budget = n - (len(ev.seq) - len(ev.committed) - ev.prompt_len) - 1  # the cycle's, as the engine's
        seen.append((ev.proposal.conf.tolist(), budget))

    out = dec.generate(prompt, max_new_tokens=n, eos_token_id=[], on_cycle=record)
    return out.token_ids, seen, out.stats.draft_passes


@pytest.mark.parametrize(
    "method, kw", [("sd", {"k": K}), ("nsd", {"k": K, "theta": 0.0}), ("prove-lossless", {"block_size": 4})]
)
@pytest.mark.parametrize("threshold", [0.12, 0.2, 0.35])
def test_draft_threshold_ends_each_proposal_at_its_first_doubtful_token(
    lm, tokenizer, prompts, refs, drafts, method, kw, threshold
):
    """Each proposal holds every token up to and including the first whose p̃ is under the threshold (or is
    full: k, K or the budget), the thresholds cut blocks at different depths, the greedy output is unchanged,
    and a draft model makes one pass per proposed token (it stops drafting, rather than drafting k and
    dropping the rest)."""
    draft = {"draft": drafts["partly"]} if method != "prove-lossless" else {}
    full = kw.get("k", kw.get("block_size"))
    dec = Decoder(lm, tokenizer, method=method, draft_threshold=threshold, **draft, **kw)
    plain = Decoder(lm, tokenizer, method=method, **draft, **kw)
    lengths: set[int] = set()
    for p, ref in zip(prompts, refs, strict=True):
        out, seen, passes = _proposals(dec, p, N)
        assert out == ref, (method, threshold)
        for conf, budget in seen:
            if not conf:
                continue
            assert all(c >= threshold for c in conf[:-1]), (conf, threshold)
            assert conf[-1] < threshold or len(conf) == min(full, budget), (conf, budget)
            lengths.add(len(conf))
        if draft:
            assert passes == sum(len(c) for c, _ in seen) <= _proposals(plain, p, N)[2]
    assert len(lengths) >= 3, lengths  # the cut falls at different depths
    assert not plain.params.draft_threshold  # off by default


def test_draft_threshold_is_a_probability_and_unfused_only(lm, tokenizer, drafts):
    with pytest.raises(ValueError, match=r"draft_threshold=1.5 is a probability"):
        Decoder(lm, tokenizer, method="sd", draft=drafts["partly"], draft_threshold=1.5)
    with pytest.raises(ValueError, match="draft_threshold cuts unfused proposals"):
        Decoder(lm, tokenizer, method="prove-lossless", block_size=4, fuse=True, draft_threshold=0.2)
    with pytest.warns(UserWarning, match=r"asd does not read \['draft_threshold'\]"):  # its gate reads k
        Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], draft_threshold=0.2)


# -- asd ------------------------------------------------------------------------------------------------------


def _regrets(lm, prompt: list[int], new: list[int]) -> torch.Tensor:
    """r_t = max z_t − z_t[x_t] of each new token under the target, teacher-forced."""
    with torch.no_grad():
        z = lm(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]  # (len(new), V)
    return z.max(-1).values - z.gather(-1, torch.tensor(new)[:, None])[:, 0]


def test_asd_budget_binds_per_request_and_resets(lm, tokenizer, prompts, refs, drafts):
    B = 1.5
    dec = Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], budget=B, gate=1.0, max_mismatches=2)
    first = dec.generate(prompts[0], max_new_tokens=N, eos_token_id=[])
    second = dec.generate(prompts[0], max_new_tokens=N, eos_token_id=[])
    assert first.token_ids == second.token_ids  # the budget reset: a fresh request behaves the same
    r = _regrets(lm, prompts[0], first.token_ids)
    spent = float(r[r > 1e-6].sum())
    assert 0 < spent <= B + 1e-4  # mismatches were accepted, within the request's budget
    assert first.token_ids != refs[0]
    assert (
        first.stats.tokens_per_cycle
        > Decoder(lm, tokenizer, method="sd", draft=drafts["partly"])
        .generate(prompts[0], max_new_tokens=N, eos_token_id=[])
        .stats.tokens_per_cycle
    )


def test_asd_defaults_and_zero_knobs(lm, tokenizer, prompts, refs, drafts):
    for knob in ("budget", "gate", "max_mismatches"):
        dec = Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], **{knob: 0})
        assert dec.generate(prompts[1], max_new_tokens=N, eos_token_id=[]).token_ids == refs[1], knob
    p = Decoder(lm, tokenizer, method="asd", draft=drafts["partly"]).params
    assert (p.k, p.budget, p.gate, p.max_mismatches) == (5, 8.0, 0.25, 2)
    with pytest.raises(ValueError, match="temperature=0"):
        Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], temperature=0.7)
    with pytest.raises(ValueError, match="needs a draft"):
        Decoder(lm, tokenizer, method="sd")
    with pytest.raises(ValueError, match="budget=-1"):
        Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], budget=-1)


def test_asd_state_lives_in_the_request_state(lm, tokenizer, prompts, drafts):
    """The adapter keeps ``AsdState`` in the engine's per-request state; replaying the cycles through the
    pure rule gives the same verdicts."""
    dec = Decoder(lm, tokenizer, method="asd", draft=drafts["partly"], gate=1.0)
    events = []
    dec.generate(prompts[2], max_new_tokens=N, eos_token_id=[], on_cycle=events.append)
    state = AsdState()
    for ev in events:
        seq = ev.seq[: len(ev.seq) - len(ev.committed)]
        with torch.no_grad():
            z = lm(torch.tensor([seq + ev.proposal.tokens.tolist()])).logits[0, len(seq) - 1 :]
        verdict, state = asd_greedy(ev.proposal.tokens, z, state, gate=1.0, block_size=K)
        assert verdict.n == ev.accept.n
    assert state.spent > 0


# -- composition: the relaxed rules on the block proposer ---------------------------------------------------


def test_relaxed_rules_compose_with_the_block_proposer(lm, tokenizer, prompts):
    """NSD's nucleus and ASD's budget on the block proposer, self-verified: a configuration (``proposer=block``),
    no new code path.
    θ = 0 / B = 0 give exactly prove-lossless; relaxed they run and accept at least as much."""
    lossless = Decoder(lm, tokenizer, method="prove-lossless", block_size=4)
    for p in prompts[:2]:
        ref = lossless.generate(p, max_new_tokens=N, eos_token_id=[])
        exact_nsd = Decoder(lm, tokenizer, method="nsd", proposer="block", theta=0.0, block_size=4)
        exact_asd = Decoder(lm, tokenizer, method="asd", proposer="block", budget=0.0, block_size=4)
        for dec in (exact_nsd, exact_asd):
            out = dec.generate(p, max_new_tokens=N, eos_token_id=[])
            assert out.token_ids == ref.token_ids
            assert out.stats.committed_per_cycle == ref.stats.committed_per_cycle
        for dec in (
            Decoder(lm, tokenizer, method="nsd", proposer="block", block_size=4),
            Decoder(lm, tokenizer, method="asd", proposer="block", block_size=4, gate=2.0),
        ):
            out = dec.generate(p, max_new_tokens=N, eos_token_id=[])
            assert out.stats.new_tokens == N and out.stats.tokens_per_cycle >= ref.stats.tokens_per_cycle


@pytest.mark.parametrize("method", ["mars", "prove"])
def test_rules_without_a_correction_token_run_on_the_draft_proposer(lm, tokenizer, prompts, drafts, method):
    """ProVe's gate / the MARS rule on a draft model: the last token of the budget still gets proposed (a draft
    that proposed budget - 1 tokens, as SD's does, left these rules nothing to commit)."""
    verifier = drafts["random"] if method == "prove" else None
    dec = Decoder(
        lm, tokenizer, method=method, proposer="draft", draft=drafts["partly"], verifier=verifier, k=K
    )
    for n in (1, 7, N):
        out = dec.generate(prompts[0], max_new_tokens=n, eos_token_id=[])
        assert len(out.token_ids) == n and out.stats.draft_passes > 0


def test_with_proposer_swaps_the_size_parameter_and_refuses_what_cannot_propose():
    nsd = get_method("nsd").with_proposer("block")
    assert nsd.name == "nsd[block]" and nsd.proposer == "block" and nsd.needs_mask
    # self-verified blocks: fusable; the proposal's cut-off applies to either proposer
    assert nsd.uses == ("block_size", "theta", "draft_threshold", "fuse", "fuse_groups")
    assert dict(nsd.defaults) == {"theta": 0.9, "draft_threshold": 0.0, "fuse": False, "fuse_groups": "auto"}
    assert get_method("nsd").with_proposer("draft") is get_method("nsd")
    back = get_method("prove-lossless").with_proposer("draft")
    assert back.uses == ("k", "draft_threshold") and dict(back.defaults) == {"k": 5, "draft_threshold": 0.0}
    assert not back.needs_mask
    with pytest.raises(ValueError, match="cannot replace the proposer of method ar"):
        get_method("ar").with_proposer("block")
    with pytest.raises(ValueError, match="can swap between"):
        get_method("sd").with_proposer("ngram")


# -- the command line -------------------------------------------------------------------------------------------


def test_prove_decode_runs_the_family_from_checkpoints(checkpoints, tmp_path):
    """``prove-decode model=TARGET draft=DRAFT method=sd|nsd|asd``: greedy sd / asd(B=0) match ar."""
    import json

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.cli import register_configs
    from prove.decode.records import run

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Ana has 3 apples\nHow many coins does Dev have?\n")

    def decode(*overrides: str) -> list[dict]:
        register_configs()
        with initialize_config_module(config_module="prove.conf.decode", version_base=None):
            cfg = compose(
                "decode", overrides=[f"model={checkpoints['mars']}", f"prompts={prompts}", *overrides]
            )
        out = run(OmegaConf.to_object(cfg))
        return [json.loads(line) for line in open(out)]

    common = ["max_new_tokens=12", "chat=false"]
    ar = decode("method=ar", f"output={tmp_path / 'ar.jsonl'}", *common)
    for method, extra in [("sd", ["draft_threshold=0.3"]), ("asd", ["budget=0"]), ("nsd", ["theta=0.5"])]:
        recs = decode(
            f"method={method}",
            f"draft={checkpoints['verifier']}",
            f"output={tmp_path / method}.jsonl",
            *extra,
            *common,
        )
        assert all(r["method"] == method and r["stats"]["draft_passes"] > 0 for r in recs)
        if method != "nsd":
            assert [r["token_ids"] for r in recs] == [r["token_ids"] for r in ar]
    # The relaxed rules on the block proposer are one override away: proposer=block (no draft model).
    recs = decode(
        "method=asd", "proposer=block", "budget=0", f"output={tmp_path / 'asd-block'}.jsonl", *common
    )
    assert all(r["method"] == "asd[block]" and r["stats"]["draft_passes"] == 0 for r in recs)
    assert [r["token_ids"] for r in recs] == [r["token_ids"] for r in ar]
