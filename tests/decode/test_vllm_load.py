"""Our rules inside vLLM under load (``prove.decode.vllm.plugin.RuleScheduler``): with a KV cache too small for the
requests in flight, vLLM preempts requests and recomputes them; a resumed request still follows our rule (its last
committed token re-fed with the drafter's block after it), so every output of ``prove`` / ``asd`` is vLLM's first
token followed by our engine's output for the prompt extended by it, and a lossless rule (``asd`` at budget 0) gives
our ``ar``'s tokens. The stats of a request vLLM pads with placeholder drafts (a one-token prompt, a prefix-cache hit,
beside running requests) equal our engine's.

Two engines (``prove`` and ``asd``), each started once for the module, with a KV cache of a few sequences.
"""

from __future__ import annotations

import dataclasses

import pytest

vllm = pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")

from prove.decode import Decoder  # noqa: E402
from prove.decode.config import DecodeParams, VllmOptions  # noqa: E402
from prove.decode.vllm.backend import VllmDecoder  # noqa: E402

from tests.decode import test_vllm_rules as rules  # noqa: E402
from tests.decode.test_vllm_rules import K, _first_then_ours  # noqa: E402

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


def _preemptions(dec: VllmDecoder) -> int:
    return int(sum(m.value for m in dec.llm.get_metrics() if m.name == "vllm:num_preemptions"))


def _engine(request, model, **kw) -> VllmDecoder:
    dec = VllmDecoder(model, options=TINY_KV, **kw)
    request.addfinalizer(dec.close)
    return dec


@pytest.fixture(scope="module")
def vllm_prove(request, ckpts):
    return _engine(request, ckpts["mars"], method="prove", verifier=ckpts["verifier-padded"])


@pytest.fixture(scope="module")
def vllm_asd(request, ckpts):
    return _engine(request, ckpts["mars"], method="asd", draft=ckpts["draft"], k=K)


def test_prove_under_preemption_follows_our_rule(vllm_prove, ckpts, many):
    """All 16 at once through a cache of a few sequences: vLLM preempts (counted), and each output is still its first
    token followed by our engine's ``prove``. Fails if a resumed request's prefill samples the verifier's token (the
    plugin without its scheduler), or if the drafts re-fed on resume are not the block after the last token."""
    ours = Decoder(ckpts["mars"], method="prove", verifier=ckpts["verifier"], theta=3e-4)
    before = _preemptions(vllm_prove)
    got = dict(vllm_prove.generate_many(many, N, sampling=DecodeParams(theta=3e-4)))
    assert _preemptions(vllm_prove) > before
    for i, p in enumerate(many):
        assert got[i].token_ids == _first_then_ours(ours, p, got[i].token_ids, n=N), i


@pytest.mark.parametrize("given", [{}, {"budget": 0.0}], ids=["asd", "asd-budget-0"])
def test_asd_under_preemption_follows_our_rule(vllm_asd, ckpts, many, given):
    """As above for ASD, whose regret budget is kept per request across its preemption; at budget 0 (exact greedy)
    the outputs are our ``ar``'s token for token."""
    ref = Decoder(ckpts["mars"], method="asd", draft=ckpts["draft"], k=K, **given)
    before = _preemptions(vllm_asd)
    sampling = dataclasses.replace(vllm_asd.params, **given)
    got = dict(vllm_asd.generate_many(many, N, sampling=sampling))
    assert _preemptions(vllm_asd) > before
    ar = Decoder(ckpts["mars"], method="ar")
    for i, p in enumerate(many):
        assert got[i].token_ids == _first_then_ours(ref, p, got[i].token_ids, n=N), i
        if given:
            assert got[i].token_ids == ar.generate(p, max_new_tokens=N).token_ids, i
