"""prove-bench, which rows a sweep makes, and which must reproduce AR."""

from __future__ import annotations

import pytest
from prove.decode.bench.rows import RowSpec, expand_rows, is_lossless

USES = {
    "ar": (),
    "mars": ("tau", "block_size"),
    "prove": ("theta", "block_size"),
    "prove-lossless": ("block_size",),
}


def test_expand_rows_sweeps_and_ar_first():
    rows = expand_rows(
        ["prove", "mars", "ar", "prove"], {"theta": [0.1, 0.3], "tau": None, "block_size": 4}, USES
    )
    assert [r.name for r in rows] == ["ar", "prove θ=0.1", "prove θ=0.3", "mars"]
    assert rows[1] == RowSpec("prove θ=0.1", "prove", {"theta": 0.1, "block_size": 4})
    assert rows[3].params == {"block_size": 4}
    grid = expand_rows(["prove"], {"theta": [0.1, 0.2], "block_size": [2, 4]}, USES)
    assert [r.name for r in grid][1:] == [
        "prove θ=0.1 K=2",
        "prove θ=0.1 K=4",
        "prove θ=0.2 K=2",
        "prove θ=0.2 K=4",
    ]
    with pytest.raises(ValueError, match="repeats"):
        expand_rows(["prove"], {"theta": [0.1, 0.1]}, USES)
    with pytest.raises(ValueError, match="empty sweep"):
        expand_rows(["prove"], {"theta": []}, USES)


def test_expand_rows_method_params():
    uses = {**USES, "nsd": ("k", "theta")}
    rows = expand_rows(["prove", "nsd"], {"theta": 0.2, "k": None}, uses, {"prove": {"theta": [0.05, 0.1]}})
    assert [(r.name, r.params) for r in rows] == [
        ("ar", {}),
        ("prove θ=0.05", {"theta": 0.05}),
        ("prove θ=0.1", {"theta": 0.1}),
        ("nsd", {"theta": 0.2}),  # the shared value still applies to the other reader of θ
    ]
    with pytest.raises(ValueError, match="does not read"):
        expand_rows(["prove"], {}, uses, {"prove": {"tau": 0.9}})
    with pytest.raises(ValueError, match="not in methods"):
        expand_rows(["prove"], {}, uses, {"mars": {"tau": 0.9}})


def test_is_lossless():
    assert (
        is_lossless("ar", {})
        and is_lossless("prove-lossless", {"block_size": 4})
        and is_lossless("sd", {"k": 5})
    )
    assert not is_lossless("prove", {"theta": 0.0}) and not is_lossless("mars", {})
    assert is_lossless("asd", {"budget": 0.0, "gate": 0.25}) and not is_lossless(
        "asd", {"budget": 8.0, "gate": 0.25}
    )


def test_fast_sweeps_every_method_with_readable_names():
    """``fast=[false,true]`` (an engine key every method takes, ``check_rows``) gives each method a reference row and a
    fast row. Fails if the sweep is dropped for a method or the rows share a name, or if no AR row answers to the
    reference's name ``ar`` (the bench then fails looking it up after loading every model)."""
    from prove.decode.bench.config import BenchConfig
    from prove.decode.bench.run import check_rows

    cfg = BenchConfig(model="m", prompts="p", methods=["ar", "prove-lossless"], fast=[False, True])
    assert [(r.name, r.params.get("fast")) for r in check_rows(cfg)] == [
        ("ar", False),  # the reference: the first greedy point of AR's sweep
        ("ar fast", True),
        ("prove-lossless reference", False),
        ("prove-lossless fast", True),
    ]
