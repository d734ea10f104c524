"""prove-bench and prove-decode on named suites: numbers by category, the position bins, the tables beside ProVe's
published curve, MT-bench's cached first answers, and one tiny end-to-end bench over the test fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.metrics import PromptRun, summarize_groups
from prove.decode.bench.published import PROVE_32B_BY_DEPTH

FIXTURES = Path(__file__).parents[2] / "data" / "suites"
MT = FIXTURES / "mt_bench_mini.jsonl"
PNG = b"\x89PNG\r\n\x1a\n"


def run(committed, accepted=(), proposed=(), text="", tokens=None, wall=1.0):
    n = sum(committed)
    return PromptRun(
        id=None,
        token_ids=list(tokens if tokens is not None else range(n)),
        text=text,
        wall_s=wall,
        cycles=len(committed),
        model_passes=len(committed),
        accepted_by_depth=list(accepted),
        proposed_by_depth=list(proposed),
        committed_per_cycle=list(committed),
    )


def test_groups_summarize_only_their_own_prompts():
    ar = [run([1] * 4, wall=4.0), run([1] * 6, wall=6.0), run([1] * 2, wall=2.0)]
    rows = [
        run([2, 2], accepted=[2, 1], proposed=[2, 2], wall=1.0),  # writing: 4 tokens in 2 cycles, 4x faster
        run([3, 3], accepted=[2, 2], proposed=[2, 2], wall=3.0),  # math
        run([1, 1], accepted=[0, 0], proposed=[2, 2], tokens=[9, 9], wall=2.0),  # math, differs from AR
    ]
    checks = [None, lambda t: True, lambda t: False]
    g = summarize_groups(rows, ar, ["mt/writing", "mt/math", "mt/math"], checks=checks)
    assert list(g) == ["mt/writing", "mt/math"]
    assert g["mt/writing"]["n_prompts"] == 1 and g["mt/writing"]["tokens_per_cycle"] == 2.0
    assert g["mt/writing"]["speedup_total"] == pytest.approx(4.0)
    assert g["mt/writing"]["acceptance_by_depth"] == [1.0, 0.5] and g["mt/writing"]["accuracy"] is None
    math_ = g["mt/math"]
    assert math_["n_prompts"] == 2 and math_["tokens_per_cycle"] == pytest.approx(8 / 4)
    assert math_["agreement"] == 0.5 and math_["accuracy"] == 0.5
    assert math_["acceptance_by_depth"] == [0.5, 0.5]
    assert summarize_groups(rows, ar, [None, None, "x"])["x"]["n_prompts"] == 1  # None: in no category


def test_position_bins_of_64_count_a_cycle_where_it_starts():
    """Cycles start at 0, 63, 64 and 127: bins 0, 0, 1, 1; the cycle from 128 opens bin 2."""
    r = run([63, 1, 63, 1, 5])
    g = summarize_groups([r], [run([1] * 133)], ["c"])["c"]["tokens_per_cycle_by_position"]
    assert g["bin_size"] == 64 and g["start"] == [0, 64, 128]
    assert g["mean"] == [32.0, 32.0, 5.0] and g["cycles"] == [2, 2, 1]


def hand_report(depths: int = 16) -> dict:
    cats = [{"name": "mt-bench/writing", "n": 2}, {"name": "mt-bench/math", "n": 1}]

    def cat(tpc, acc, pos):
        return {"n_prompts": 1, "new_tokens": 10, "cycles": 5, "tokens_per_cycle": tpc, "speedup_median": 1.5,
                "speedup_total": 1.4, "agreement": 1.0, "accuracy": None, "acceptance_by_depth": acc,
                "tokens_per_cycle_by_position": pos}  # fmt: skip

    pos = {"bin_size": 64, "start": [0, 64], "mean": [2.0, 3.5], "cycles": [30, 20]}
    acc = [0.9 - 0.05 * i for i in range(depths)]
    block = {
        "name": "prove-lossless", "method": "prove-lossless", "params": {"block_size": depths}, "swept": {},
        "lossless": True, "tokens_per_cycle": 2.5, "model_passes_per_token": 0.4, "verifier_passes_per_token": 0.0,
        "draft_passes_per_token": 0.0, "tokens_per_s": 10.0, "speedup_median": 1.5, "speedup_total": 1.4,
        "agreement": 1.0, "mean_first_divergence": None, "accuracy": None, "acceptance_by_depth": acc,
        "by_position": pos,
        "by_category": {"mt-bench/writing": cat(2.25, acc, pos),
                        "mt-bench/math": cat(4.0, [0.5] * depths, {**pos, "start": [0], "mean": [4.0]})},
    }  # fmt: skip
    ar = {**block, "name": "ar", "method": "ar", "params": {}, "tokens_per_cycle": 1.0, "acceptance_by_depth": [],
          "by_category": {k: {**v, "tokens_per_cycle": 1.0, "acceptance_by_depth": []}
                          for k, v in block["by_category"].items()}}  # fmt: skip
    return {
        "rows": [ar, block],
        "categories": cats,
        "trace": None,
        "prompts": {"n": 3, "with_answers": 0, "suite": ["mt-bench"]},
        "suites": {
            "mt-bench": {
                "title": "MT-bench, first turns",
                "generated": False,
                "package": "p",
                "version": "26.3",
                "source": "/x/question.jsonl",
                "n": 3,
                "categories": {"writing": 2, "math": 1},
                "scored": True,
            }
        },  # fmt: skip
    }


def table_lines(md: str, first_cell: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in md.splitlines()
        if line.startswith(f"| {first_cell} ")
    ]


def test_category_table_has_a_line_per_category_and_row():
    from prove.decode.bench.report import render_categories

    md = render_categories(hand_report())
    writing = table_lines(md, "mt-bench/writing")
    assert [c[2] for c in writing] == ["ar", "prove-lossless"]
    assert writing[1][4] == "2.25" and writing[1][5] == "1.40×" and writing[1][7] == "100%"
    assert [c[4] for c in table_lines(md, "mt-bench/math")] == ["1.00", "4.00"]
    assert render_categories({**hand_report(), "categories": []}) == ""


def test_acceptance_table_shows_only_the_published_depths_of_prove():
    from prove.decode.bench.report import render_acceptance

    md = render_acceptance(hand_report(16))
    (prove,) = [line for line in table_lines(md, "ProVe") if len(line) == 17][:1]
    assert prove[1:9] == ["96%", "86%", "79%", "71%", "67%", "59%", "53%", "51%"]
    assert prove[9:16] == ["–"] * 7 and prove[16] == "27%"  # 9..15 not published: nothing interpolated
    (ours,) = table_lines(md, "prove-lossless: accepted")
    assert ours[1] == "90%" and ours[16] == "15%"
    assert "### prove-lossless: accepted at depth i, by category" in md
    assert table_lines(md, "mt-bench/math")[0][1:3] == ["50%", "50%"]
    short = render_acceptance(hand_report(4))  # K = 4: ProVe's depth 16 is named in the text
    assert "Its depth 16: 27%." in short and len(table_lines(short, "ProVe")[0]) == 5


def test_position_table_heads_are_64_token_spans():
    from prove.decode.bench.report import render_positions

    md = render_positions(hand_report())
    assert "| category | 0–63 | 64–127 |" in md
    assert table_lines(md, "all")[0][1:] == ["2.00", "3.50"]
    assert table_lines(md, "mt-bench/math")[0][1:] == ["4.00", ""]
    assert "### ar" not in md  # AR commits one token a cycle: no table


def test_plots_draw_the_category_figures(tmp_path):
    from prove.decode.bench.plots import plot_acceptance_by_category, plot_tokens_per_cycle_by_category

    for fn in (plot_acceptance_by_category, plot_tokens_per_cycle_by_category):
        path = fn(hand_report(), tmp_path / f"{fn.__name__}.png")
        assert path.read_bytes()[:8] == PNG


def test_published_curve_is_the_papers_points():
    assert sorted(PROVE_32B_BY_DEPTH) == [1, 2, 3, 4, 5, 6, 7, 8, 16]
    assert PROVE_32B_BY_DEPTH[1] == 0.96 and PROVE_32B_BY_DEPTH[4] == 0.71 and PROVE_32B_BY_DEPTH[8] == 0.51


# --- MT-bench's first answers: decoded once per model ------------------------------------------------------------


def test_first_answers_are_cached_and_a_torn_line_is_redone(tmp_path):
    from prove.data.suites import read_mt_bench
    from prove.decode.suites import first_answers

    questions = read_mt_bench(MT)[:3]
    calls = []

    def gen(messages):
        calls.append(messages[0]["content"])
        return f"reply {len(calls)}", 2

    cache = tmp_path / "c.jsonl"
    got = first_answers(questions, gen, cache, {"max_new_tokens": 8})
    assert got == {1: "reply 1", 2: "reply 2", 3: "reply 3"} and len(calls) == 3
    assert calls[0] == questions[0].turns[0]  # the first turn alone
    assert first_answers(questions, lambda m: pytest.fail("decoded again"), cache, {}) == got
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # killed mid-line
    again = first_answers(questions, gen, cache, {})
    assert again[3] == "reply 4" and len(calls) == 4 and len(cache.read_text().splitlines()) == 3


def test_fingerprint_follows_the_weights_not_the_object(lm):
    import copy

    import torch
    from prove.decode.suites import model_fingerprint

    twin = copy.deepcopy(lm)
    assert model_fingerprint(twin) == model_fingerprint(lm)
    with torch.no_grad():
        next(twin.parameters()).add_(1e-3)
    assert model_fingerprint(twin) != model_fingerprint(lm)


def test_config_takes_prompts_or_a_suite():
    with pytest.raises(ValueError, match="one of the two"):
        BenchConfig(model="m")
    with pytest.raises(ValueError, match="one of the two"):
        BenchConfig(model="m", prompts="p.jsonl", suite="mt-bench")
    with pytest.raises(ValueError, match="not a known suite"):
        BenchConfig(model="m", suite=["mt-bench", "gsm8k"])
    with pytest.raises(ValueError, match="suite_files"):
        BenchConfig(model="m", prompts="p.jsonl", suite_files={"mt-bench": "x"})
    assert BenchConfig(model="m", suite=["mt-bench", "humaneval"]).position_bin == 64


def test_per_category_takes_one_count_or_one_per_suite():
    """A count per suite: HumanEval and the arithmetic set are one category each, MT-bench eight — one shared count
    gives them 8x fewer prompts. Catches a mapping applied to the wrong suite, a suite left out that loses its
    prompts instead of keeping all, and a misspelt suite name passing silently."""
    from prove.decode.suites import load_suites, per_category_counts

    names = ["mt-bench", "humaneval"]
    assert per_category_counts(2, names) == {"mt-bench": 2, "humaneval": 2}
    assert per_category_counts(None, names) == {"mt-bench": None, "humaneval": None}
    assert per_category_counts({"humaneval": 40}, names) == {"mt-bench": None, "humaneval": 40}
    with pytest.raises(ValueError, match=r"names \['humanevl'\]"):
        per_category_counts({"humanevl": 4}, names)
    with pytest.raises(ValueError, match="integer ≥ 1"):
        per_category_counts({"mt-bench": 0}, names)
    with pytest.raises(ValueError, match="per_category"):
        BenchConfig(model="m", suite=names, per_category={"mt-bnch": 2})
    assert BenchConfig(model="m", suite=names, per_category={"mt-bench": 1}).per_category == {"mt-bench": 1}
    he = FIXTURES / "humaneval_mini.jsonl"
    got = load_suites(
        names, per_category={"mt-bench": 1}, sources={"mt-bench": str(MT), "humaneval": str(he)}
    )
    by_suite = {n: [r for r, s in zip(got.records, got.suites, strict=True) if s == n] for n in names}
    assert len(by_suite["mt-bench"]) == 3  # one of each of the mini file's three categories
    assert len(by_suite["humaneval"]) == len(he.read_text().splitlines())  # left out: all of it


# --- end to end --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mars_dir(tmp_path_factory, lm, tokenizer):
    from prove.common.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json

    root = tmp_path_factory.mktemp("suite-bench")
    lm.save_pretrained(root / "mars")
    tokenizer.save_pretrained(root / "mars")
    write_prove_json(
        root / "mars",
        ProveMeta("mars", "tiny-random", 4, MASK_TOKEN, tokenizer.convert_tokens_to_ids(MASK_TOKEN)),
    )
    return root


def test_bench_over_two_suites_reports_by_category(mars_dir):
    from prove.decode.bench.run import run_bench

    out, cache = mars_dir / "out", mars_dir / "cache"
    cfg = BenchConfig(
        model=str(mars_dir / "mars"),
        suite=["mt-bench", "mt-bench-2"],
        suite_files={"mt-bench": str(MT), "mt-bench-2": str(MT)},
        per_category=1,
        methods=["ar", "prove-lossless"],
        max_new_tokens=6,
        first_answer_tokens=5,
        suite_cache=str(cache),
        warmup=0,
        hf=False,
        quality=False,
        trace=False,
        progress=False,
        output_dir=str(out),
    )
    report = run_bench(cfg)
    names = [c["name"] for c in report["categories"]]
    assert names == [f"{s}/{c}" for s in ("mt-bench", "mt-bench-2") for c in ("writing", "math", "coding")]
    assert [c["n"] for c in report["categories"]] == [1] * 6
    assert report["prompts"]["suite"] == ["mt-bench", "mt-bench-2"] and report["prompts"]["n"] == 6
    rows = {r["name"]: r for r in report["rows"]}
    lossless = rows["prove-lossless"]
    assert set(lossless["by_category"]) == set(names)
    assert all(g["agreement"] == 1.0 for g in lossless["by_category"].values())
    assert sum(g["new_tokens"] for g in lossless["by_category"].values()) == lossless["new_tokens"]
    assert len(lossless["by_category"]["mt-bench/math"]["acceptance_by_depth"]) == 4
    assert lossless["by_position"]["bin_size"] == 64
    first = report["suites"]["mt-bench-2"]["first_answer"]
    assert first["max_new_tokens"] == 5 and Path(first["cache"]).parent == cache
    (cached,) = cache.iterdir()
    answers = [json.loads(line) for line in cached.read_text().splitlines()]
    assert [a["id"] for a in answers] == [1, 3, 5] and all(0 < a["new_tokens"] <= 5 for a in answers)
    md = (out / "bench.md").read_text()
    for section in ("## By category", "## Acceptance by block position, beside ProVe's published 32B curve",
                    "## Tokens per cycle by position in the response (bins of 64 tokens)",
                    "second turns follow the model's own AR greedy first answers of at most 5 new tokens"):  # fmt: skip
        assert section in md, section
    for name in ("acceptance_by_category", "tokens_per_cycle_by_category", "acceptance_by_position"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG
    # a second bench on the same model reads the first answers from the cache: the same second turns
    before = cached.read_text()
    again = run_bench(BenchConfig(**{**cfg.__dict__, "suite": ["mt-bench-2"], "suite_files": {"mt-bench-2": str(MT)},
                                     "methods": ["ar"], "output_dir": str(out / "again")}))  # fmt: skip
    assert cached.read_text() == before
    assert [r["per_prompt"][0]["text"] for r in again["rows"]] == [rows["ar"]["per_prompt"][3]["text"]]
    assert not math.isnan(again["rows"][0]["tokens_per_cycle"])


def test_prove_decode_writes_each_records_category(mars_dir, tmp_path):
    from prove.decode.config import DecodeConfig
    from prove.decode.records import run as decode_file

    cfg = DecodeConfig(
        model=str(mars_dir / "mars"),
        method="ar",
        suite="mt-bench",
        suite_files={"mt-bench": str(MT)},
        per_category=1,
        max_new_tokens=3,
        output=str(tmp_path / "out.jsonl"),
    )
    decode_file(cfg)
    recs = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["id"], r["category"]) for r in recs] == [
        ("mt-bench/1", "mt-bench/writing"), ("mt-bench/3", "mt-bench/math"), ("mt-bench/5", "mt-bench/coding"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="one of the two"):
        DecodeConfig(model="m", output="o", method="ar")
