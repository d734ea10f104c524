"""tools/bench_fast_paths.py: each row runs the path it names, and a row whose tokens differ from the first row's
is flagged (the tool's exit status rests on it)."""

from __future__ import annotations

from prove.decode import Decoder

from tests.tools_helpers import load_tool


def test_rows_run_their_path_and_a_different_output_is_flagged(lm, make_lm, tokenizer, prompts):
    tool = load_tool("bench_fast_paths")
    other = make_lm(seed=11)

    def build(**kw):
        # the fast rows of prove-lossless decode another model: their tokens must be flagged, ar's must not
        model = other if kw["fast"] and kw["method"] == "prove-lossless" else lm
        extra = {"block_size": 4} if kw["method"] == "prove-lossless" else {}
        return Decoder(model, tokenizer, **kw, **extra)

    rows = tool.measure(
        build, prompts[:3], methods=["ar", "prove-lossless"], paths=["reference", "fast"], cache_len=128,
        max_new_tokens=8, repeats=1,
    )  # fmt: skip
    assert [(r["method"], r["ran"]) for r in rows] == [
        ("ar", "reference"), ("ar", "fast"), ("prove-lossless", "reference"), ("prove-lossless", "fast"),
    ]  # fmt: skip
    assert [r["same_as_first_row"] for r in rows] == [True, True, True, False]
    assert all(r["tok_s"] > 0 for r in rows)
    md = tool.table(rows)
    assert md.count("| yes |") == 3 and "| **no** |" in md and "| 1.00× |" in md
