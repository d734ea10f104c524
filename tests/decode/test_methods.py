"""The method registry is the one home of each method's facts: what it reads, whether it is lossless, what
models it needs. Every reader (the Decoder, the bench) asks the ``Method``."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from prove.decode.bench.rows import is_lossless
from prove.decode.methods import METHOD_KEYS, METHODS, get_method, register_method


@pytest.fixture
def registered():
    """Register methods for one test and remove them afterwards."""
    added: list[str] = []

    def add(method):
        register_method(method)
        added.append(method.name)
        return method

    yield add
    for name in added:
        METHODS.pop(name, None)


def test_every_method_reads_only_method_keys():
    for m in METHODS.values():
        assert set(m.uses) <= set(METHOD_KEYS), m.name


def test_lossless_is_a_registry_fact():
    assert {n for n, m in METHODS.items() if m.is_lossless({})} == {"ar", "prove-lossless", "sd", "pard"}
    asd = get_method("asd")
    assert asd.is_lossless({"budget": 0.0, "gate": 0.25}) and not asd.is_lossless(
        {"budget": 8.0, "gate": 0.25}
    )
    assert asd.with_proposer("block").is_lossless({"max_mismatches": 0})  # the fact follows the proposer swap


def test_the_bench_reads_lossless_from_the_registry(registered):
    """A new lossless method is checked against AR by the bench without editing the bench."""
    registered(dataclasses.replace(get_method("ar"), name="ar-copy"))
    registered(dataclasses.replace(get_method("ar"), name="ar-lossy", lossless=False))
    assert is_lossless("ar-copy", {}) and not is_lossless("ar-lossy", {})
    assert is_lossless("hf-greedy", {}) and is_lossless("hf-assisted", {"k": 5})


def test_unread_keys_come_from_the_method():
    m = dataclasses.replace(get_method("ar"), name="theta-only", uses=("theta",))
    assert m.unread({"theta": 0.1, "tau": 0.5, "temperature": 1.0, "seed": 3}) == ["tau"]
    assert get_method("mars").unread({"tau", "block_size", "k"}) == ["k"]


def test_the_decoder_warns_with_the_methods_unread_keys(registered, lm, tokenizer):
    from prove.decode import Decoder

    registered(dataclasses.replace(get_method("ar"), name="ar-reads-k", uses=("k",), defaults={"k": 2}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Decoder(lm, tokenizer, method="ar-reads-k", k=3)  # read: no warning
    with pytest.warns(UserWarning, match=r"does not read \['tau'\]") as caught:
        Decoder(lm, tokenizer, method="ar-reads-k", tau=0.5)
    assert caught[0].filename == __file__  # the warning points at the caller, not into the Decoder


def test_model_needs_are_properties_of_the_method():
    assert get_method("prove").needs_verifier and not get_method("prove-lossless").needs_verifier
    assert get_method("sd").needs_draft and not get_method("sd").with_proposer("block").needs_draft
