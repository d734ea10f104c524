"""What the Decoder guarantees whatever the method: the placeholder token is never proposed to a stock verifier nor
output, ``accepted_by_depth`` counts committed tokens only, ProVe commits the leading run where p̃·q crosses θ,
and a stop string inside a block ends the output where the method would."""

from __future__ import annotations

import copy

import pytest
import torch
from prove.decode import Decoder

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


def _boost(model, token: int, by: float = 100.0):
    """A copy of ``model`` whose logit of ``token`` is raised by ``by`` at every position (a forward hook)."""
    boosted = copy.deepcopy(model)

    def hook(_module, _args, out):
        out.logits[..., token] += by
        return out

    boosted.register_forward_hook(hook)
    return boosted


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_block_proposer_never_proposes_the_mask_to_a_stock_verifier(checkpoints, temperature):
    """The MARS model's favourite token is <|mask|> (its last id); the verifier is a stock checkpoint without a
    <|mask|> row. Before the fix the mask was proposed and the verifier's embedding lookup raised IndexError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoints["mars_on_stock"])
    mask = tok.convert_tokens_to_ids("<|mask|>")
    assert mask == len(tok) - 1
    model = _boost(AutoModelForCausalLM.from_pretrained(checkpoints["mars_on_stock"]), mask)
    verifier = AutoModelForCausalLM.from_pretrained(checkpoints["stock"])
    assert verifier.get_output_embeddings().weight.shape[0] == mask  # no row for the mask
    proposed: list[int] = []
    dec = Decoder(model, tok, method="prove", verifier=verifier, temperature=temperature, block_size=4)
    out = dec.generate(
        "Ana has 3 apples",
        max_new_tokens=16,
        eos_token_id=[],
        on_cycle=lambda ev: proposed.extend(ev.proposal.tokens.tolist()),
    )
    assert len(out.token_ids) == 16 and proposed
    assert mask not in proposed and mask not in out.token_ids


@pytest.mark.parametrize("method", ["ar", "sd", "nsd", "mars", "prove-lossless"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_mask_is_never_output_wherever_its_id_is(lm, small, tokenizer, prompts, method, temperature):
    """The session tokenizer's <|mask|> is id 3, not the last id. Target and draft both favour it."""
    mask = tokenizer.convert_tokens_to_ids("<|mask|>")
    assert mask != len(tokenizer) - 1
    if method == "prove-lossless" and temperature > 0:
        pytest.skip("prove-lossless is greedy only")
    kw = (
        {"draft": _boost(small, mask)}
        if method in ("sd", "nsd")
        else {"block_size": 4}
        if method != "ar"
        else {}
    )
    proposed: list[int] = []
    dec = Decoder(_boost(lm, mask), tokenizer, method=method, temperature=temperature, **kw)
    out = dec.generate(
        prompts[0],
        max_new_tokens=12,
        eos_token_id=[],
        on_cycle=lambda ev: proposed.extend(ev.proposal.tokens.tolist()),
    )
    assert len(out.token_ids) == 12
    assert mask not in proposed and mask not in out.token_ids


def test_vocab_rows_check_does_not_assume_the_mask_is_last(lm, tokenizer, make_lm):
    """The mask is id 3 here: a verifier with len(tokenizer) − 1 rows lacks a real token (id 299), not the mask.
    The old check (len − 1 rows suffice when there is a mask) let it through."""
    short = make_lm(seed=4, vocab=len(tokenizer) - 1)
    with pytest.raises(ValueError, match="scores 299 tokens"):
        Decoder(lm, tokenizer, method="prove", verifier=short, block_size=4)
    with pytest.raises(ValueError, match="scores 299 tokens"):
        Decoder(lm, tokenizer, method="sd", draft=short)


# -- accepted_by_depth counts what was committed ---------------------------------------------------------------


def test_accepted_by_depth_counts_only_committed_tokens(lm, tokenizer, prompts):
    """A draft equal to the target: every proposed token is accepted. A stop string inside the block cuts it;
    the positions after the cut must not count as accepted (the old tally counted all 8). EOS cannot cut an
    sd block: the draft stops proposing after the request's EOS."""
    p = prompts[0]
    ref = Decoder(lm, tokenizer, method="ar").generate(p, max_new_tokens=8, eos_token_id=[]).token_ids
    eos = ref[4]
    assert eos not in ref[:4]
    dec = Decoder(lm, tokenizer, method="sd", draft=copy.deepcopy(lm), k=8)
    out = dec.generate(p, max_new_tokens=40, eos_token_id=eos)
    assert out.token_ids == ref[:5]
    assert out.stats.proposed_by_depth == [1] * 5 == out.stats.accepted_by_depth
    # max_new_tokens inside the block: the budget caps the proposal itself (k = 3 here, nothing cut)
    out = dec.generate(p, max_new_tokens=4, eos_token_id=[])
    assert out.stats.accepted_by_depth == [1] * 3 == out.stats.proposed_by_depth
    # a stop string inside a block
    text = tokenizer.decode(ref[:3])
    out = dec.generate(p, max_new_tokens=40, eos_token_id=[], stop=[text[-1]])
    n = len(out.token_ids)
    assert n < 8 and out.stats.accepted_by_depth == [1] * n + [0] * (8 - n)


# -- every parameter is validated when the Decoder (and the CLI) starts ----------------------------------------


def _leading(ok: list[bool]) -> int:
    n = 0
    while n < len(ok) and ok[n]:
        n += 1
    return n


def test_prove_commits_the_leading_run_where_p_times_q_straddles_theta(lm, small, tokenizer, prompts):
    """Independently of the engine (plain forwards, no cache): p̃_i from the block pass over [prompt, M×(K−1)],
    q_i = the verifier's probability of y_i given prompt + y_<i. θ is put between two scores so the run is
    partial (1 < n < K) and would differ if q were read from the next verifier row or left out (p̃ ≥ θ)."""
    K = 4
    mask = tokenizer.convert_tokens_to_ids("<|mask|>")
    checked = 0
    for p in prompts:
        dec0 = Decoder(lm, tokenizer, method="prove", verifier=small, block_size=K, theta=0.0)
        events = []
        dec0.generate(p, max_new_tokens=K, eos_token_id=[], on_cycle=events.append)
        y = events[0].proposal.tokens.tolist()
        with torch.no_grad():
            block = lm(torch.tensor([p + [mask] * (K - 1)])).logits[0, len(p) - 1 :].softmax(-1)  # (K, V)
            ver = small(torch.tensor([p + y])).logits[0, len(p) - 1 :].softmax(-1)  # (K+1, V)
        conf = [float(block[i, y[i]]) for i in range(K)]
        q = [float(ver[i, y[i]]) for i in range(K)]
        q_next = [float(ver[i + 1, y[i]]) for i in range(K)]
        assert events[0].proposal.conf.tolist() == pytest.approx(conf, abs=1e-3)  # cached vs full forward
        scores = {"right": [c * v for c, v in zip(conf, q, strict=True)], "next row": [c * v for c, v in zip(conf, q_next, strict=True)],
                  "no q": conf}  # fmt: skip
        cuts = sorted({v for s in scores.values() for v in s})
        for theta in [
            (a + b) / 2 for a, b in zip(cuts, cuts[1:], strict=False) if b - a > 0.02 * b
        ]:  # clear of rounding
            n = {name: max(1, _leading([v >= theta for v in s])) for name, s in scores.items()}
            if 1 < n["right"] < K and n["right"] != n["next row"] and n["right"] != n["no q"]:
                break
        else:
            continue
        s = scores["right"]
        assert s[n["right"] - 1] >= theta > s[n["right"]]  # the run straddles θ
        dec = Decoder(lm, tokenizer, method="prove", verifier=small, block_size=K, theta=theta)
        events.clear()
        dec.generate(p, max_new_tokens=3 * K, eos_token_id=[], on_cycle=events.append)
        assert events[0].proposal.tokens.tolist() == y
        assert events[0].accept.n == n["right"] and events[0].committed == y[: n["right"]]
        checked += 1
    assert checked >= 2


# -- stop strings inside a block, for every method that can cross one there --------------------------------------

STOP_METHODS = {
    "sd": {"k": 5},
    "nsd": {"k": 5},
    "asd": {"k": 5},
    "mars": {"tau": 0.0, "block_size": 4},  # whole blocks: the stop string lands inside one
    "prove": {"theta": 0.0, "block_size": 4},
    "prove-lossless": {"block_size": 4},
    "ar": {},
}


def _stop_inside_a_block(tokenizer, out: list[int], committed: list[int]) -> tuple[str, int] | None:
    """A stop string first completed by a token that is not the last of its cycle, and that token's index."""
    ends, total = set(), 0
    for c in committed:
        total += c
        ends.add(total - 1)
    for j in range(2, len(out) - 1):
        stop = tokenizer.decode(out[: j + 1])[-2:]
        if not stop.strip():
            continue
        first = next(i for i in range(len(out)) if stop in tokenizer.decode(out[: i + 1]))
        if first == j and (j not in ends or not committed):
            return stop, j
    return None


@pytest.mark.parametrize("method", list(STOP_METHODS))
def test_stop_string_inside_a_block_ends_where_the_method_would(lm, small, tokenizer, prompts, method):
    """The output ends at the token that completes the stop string (included), even when a rule accepted more of
    the block; for the lossless methods that is transformers' own ``stop_strings`` output."""
    kw = dict(STOP_METHODS[method])
    if method in ("sd", "nsd", "asd"):
        kw["draft"] = copy.deepcopy(lm)  # accepts whole blocks
    if method == "prove":
        kw["verifier"] = small
    dec = Decoder(lm, tokenizer, method=method, **kw)
    p = prompts[0]
    events = []
    full = dec.generate(p, max_new_tokens=30, eos_token_id=[], on_cycle=events.append).token_ids
    committed = [len(e.committed) for e in events]
    found = _stop_inside_a_block(tokenizer, full, committed if method != "ar" else [])
    assert found is not None
    stop, j = found
    out = dec.generate(p, max_new_tokens=30, eos_token_id=[], stop=[stop])
    assert out.token_ids == full[: j + 1]
    if method in ("ar", "prove-lossless", "sd"):
        hf = lm.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=30,
            do_sample=False, eos_token_id=None, pad_token_id=0, stop_strings=[stop], tokenizer=tokenizer,
            suppress_tokens=[tokenizer.convert_tokens_to_ids("<|mask|>")],
        )[0, len(p):].tolist()  # fmt: skip
        assert out.token_ids == hf
