"""Every greedy method on both kinds of cycle equals the cacheless oracle (``tests/oracle.py``) token for token.

Four model families, K = 4 and 16, and each of AR's three endings inside a block: ``max_new_tokens`` (23: not a
multiple of K + 1), an EOS the oracle reaches mid-block, a stop string. The composed cycle runs every method; the
device cycle (``fast=true``) every method whose registry entry names a rule twin. Fails on any cache, mask, position
or stopping mistake of either cycle that changes a token, and on a registry entry whose twin is not its rule.
"""

from __future__ import annotations

import warnings

import pytest
from prove.decode import Decoder
from prove.decode.methods import get_method

from tests.decode.engine.test_fast_stale import build
from tests.oracle import oracle

FAMILIES = ["qwen2-eager", "qwen2-sdpa", "llama-tied", "qwen3"]
N = 23
CASES = {  # name: (Decoder keywords, the oracle's method and parameters)
    "ar": ({"method": "ar"}, "ar", {}),
    "mars": ({"method": "mars", "tau": 0.3}, "mars", {"tau": 0.3}),
    "prove": ({"method": "prove", "verifier": "other", "theta": 0.05}, "prove", {"theta": 0.05}),
    "prove-lossless": ({"method": "prove-lossless"}, "prove-lossless", {}),
    "fused-auto": ({"method": "prove-lossless", "fuse": True}, "prove-lossless", {}),
    "fused-2": ({"method": "prove-lossless", "fuse": True, "fuse_groups": 2}, "prove-lossless", {}),
    "fused-all": ({"method": "prove-lossless", "fuse": True, "fuse_groups": "all"}, "prove-lossless", {}),
    "sd": ({"method": "sd", "draft": "other"}, "sd", {}),
    "nsd": ({"method": "nsd", "draft": "other", "theta": 0.5}, "nsd", {"theta": 0.5}),
    "asd": (
        {"method": "asd", "draft": "other"},
        "asd",
        {"asd": {"budget": 8.0, "gate": 0.25, "max_mismatches": 2}},
    ),
    "pard": ({"method": "pard", "draft": "self"}, "pard", {}),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    V = len(tokenizer)
    return {f: (build(f, V, seed=7, std=0.12), build(f, V, seed=8, std=0.2)) for f in FAMILIES}


def _decoder(models, family, case, K, tokenizer, fast):
    target, other = models[family]
    kw = dict(CASES[case][0])
    for role in ("draft", "verifier"):
        if role in kw:
            kw[role] = target if kw[role] == "self" else other
    kw["block_size" if get_method(kw["method"]).proposer in ("block", "draft-block") else "k"] = K
    if kw["method"] == "ar":
        del kw["k"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "records no trained block size"
        return Decoder(target, tokenizer, fast=fast, **kw)


def _device_serves(case: str) -> bool:
    kw = CASES[case][0]
    return get_method(kw["method"]).twin is not None and (
        not kw.get("fuse") or kw.get("fuse_groups") == "all"
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("K", [4, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_every_method_on_both_cycles_equals_the_oracle(models, family, K, case, tokenizer, prompts):
    target, other = models[family]
    _, name, params = CASES[case]
    kinds = [False] + [True] * _device_serves(case)
    decoders = [_decoder(models, family, case, K, tokenizer, fast) for fast in kinds]
    dec = decoders[0]
    roles = {"verifier": other if name == "prove" else None}
    roles["draft"] = target if name == "pard" else other if name in ("sd", "nsd", "asd") else None
    common = dict(K=K, mask_id=dec.models.mask_token_id, allowed=dec.models.allowed, **roles, **params)
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=False)  # noqa: E731
    prompt = prompts[3]
    full = oracle(name, target, prompt, N, **common)
    eos = full[9]
    text = decode(full)
    stop = next(text[j : j + 2] for j in range(len(text) // 2, len(text) - 1) if text[j : j + 2].strip())
    endings = [
        ({"eos_token_id": []}, {}),
        ({"eos_token_id": [eos]}, {"eos": [eos]}),
        ({"eos_token_id": [], "stop": [stop]}, {"stop": [stop], "decode": decode}),
    ]
    for ours, theirs in endings:
        want = oracle(name, target, prompt, N, **common, **theirs)
        for d in decoders:
            out = d.generate(prompt, max_new_tokens=N, **ours)
            assert out.token_ids == want, (case, family, K, d.fast_engine is not None, ours)
            assert (out.stats.fast is not None) == (d.fast_engine is not None), (
                "the cycle kind asked for did not run"
            )


WINDOW = 6
"""A window the 70-token prompt outruns many times over, wider than a block (K = 4)."""


@pytest.mark.parametrize("case", ["ar", "prove-lossless", "fused-2", "mars"])
@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_the_composed_cycle_applies_a_sliding_window(kind, case, tokenizer, prompts):
    """A context many times the window (``WINDOW``) on the composed cycle, linear and tree passes: fails if its runner
    drops the window or applies it to a mixed model's full-attention layers, against the cacheless oracle
    (transformers applies the window itself)."""
    from tests.decode.engine.test_fast_stale import build_sliding

    target = build_sliding(kind, len(tokenizer), window=WINDOW)
    kw = dict(CASES[case][0], block_size=4) if case != "ar" else {"method": "ar"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "records no trained block size"
        dec = Decoder(target, tokenizer, fast=False, **kw)
    _, name, params = CASES[case]
    p = prompts[3]  # 70 tokens
    want = oracle(
        name, target, p, N, K=4, mask_id=dec.models.mask_token_id, allowed=dec.models.allowed, **params
    )
    assert dec.generate(p, max_new_tokens=N, eos_token_id=[]).token_ids == want
