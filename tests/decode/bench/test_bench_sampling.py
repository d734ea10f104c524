"""prove-bench's sampled rows beside greedy (``temperature=[0,0.7]``): which rows a sweep makes, that the temperature
and the per-prompt seed reach the decoder, and which AR row a sampled row's speedup is over."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from prove.decode.bench.build import speedup_references
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.report import render_categories, render_table
from prove.decode.bench.rows import RowSpec, greedy_only_skips
from prove.decode.bench.run import check_rows

GREEDY_ONLY = {"prove-lossless", "asd", "pard"}


def names(**kw) -> list[str]:
    return [r.name for r in check_rows(BenchConfig(model="m", prompts="p", **kw))]


def test_temperature_sweep_rows_beside_greedy_and_greedy_only_skipped():
    assert names(methods=["ar", "sd", "asd", "prove-lossless"], temperature=[0, 0.7]) == [
        "ar", "ar T=0.7", "sd", "sd T=0.7", "asd", "prove-lossless",
    ]  # fmt: skip
    # one value, not swept: a sampled row's name still says T; AR keeps its greedy row (the reference)
    assert names(methods=["ar", "sd", "prove-lossless"], temperature=0.7) == [
        "ar", "ar T=0.7", "sd T=0.7", "prove-lossless",
    ]  # fmt: skip
    # one method alone; the others stay greedy, and AR has no sampled row
    assert names(methods=["ar", "sd", "prove"], method_params={"sd": {"temperature": 0.7}}) == [
        "ar",
        "sd T=0.7",
        "prove",
    ]
    # top-p only where a row samples: the greedy row once, not one per top-p
    assert names(methods=["sd"], temperature=[0, 0.7], top_p=[0.9, 1.0]) == [
        "ar", "ar T=0.7 top-p=0.9", "ar T=0.7 top-p=1", "sd", "sd T=0.7 top-p=0.9", "sd T=0.7 top-p=1",
    ]  # fmt: skip
    rows = {
        r.name: r
        for r in check_rows(BenchConfig(model="m", prompts="p", methods=["sd"], temperature=[0, 0.7]))
    }
    assert rows["sd T=0.7"].params == {"temperature": 0.7} and rows["sd"].params == {}
    sweeps = {"temperature": [0, 0.7]}
    assert greedy_only_skips(["ar", "sd", "asd", "prove-lossless"], sweeps, GREEDY_ONLY) == {
        "asd": [0.7], "prove-lossless": [0.7],
    }  # fmt: skip
    assert greedy_only_skips(["prove-lossless"], {"temperature": [0]}, GREEDY_ONLY) == {}
    # asked for by name (not a sweep): the method's own error, before any model loads
    with pytest.raises(ValueError, match="greedy"):
        names(methods=["prove-lossless"], method_params={"prove-lossless": {"temperature": 0.7}})
    with pytest.raises(ValueError, match="drop temperature"):
        BenchConfig(hf_compare="tiny", temperature=[0, 0.7])
    with pytest.raises(ValueError, match="seed"):
        BenchConfig(model="m", prompts="p", seed=-1)


def _dec(t: float = 0.0, top_p: float = 1.0, top_k: int = 0) -> SimpleNamespace:
    return SimpleNamespace(params=SimpleNamespace(temperature=t, top_p=top_p, top_k=top_k))


def test_speedup_reference_is_ar_at_the_same_temperature_else_greedy_ar():
    specs = [RowSpec("ar", "ar"), RowSpec("ar T=0.7", "ar"), RowSpec("sd", "sd"), RowSpec("sd T=0.7", "sd"),
             RowSpec("sd T=0.9", "sd"), RowSpec("mars T=0.7 top-p=0.9", "mars")]  # fmt: skip
    decoders = {"ar": _dec(), "ar T=0.7": _dec(0.7), "sd": _dec(), "sd T=0.7": _dec(0.7), "sd T=0.9": _dec(0.9),
                "mars T=0.7 top-p=0.9": _dec(0.7, top_p=0.9)}  # fmt: skip
    assert speedup_references(specs, decoders) == {
        "ar": "ar", "ar T=0.7": "ar",  # sampled AR against greedy AR: sampling's own cost
        "sd": "ar", "sd T=0.7": "ar T=0.7",
        "sd T=0.9": "ar", "mars T=0.7 top-p=0.9": "ar",  # no AR row at that T / top-p: greedy AR, labelled
    }  # fmt: skip


def _row(name: str, t: float, over: str, agreement: float = 0.5) -> dict:
    return {
        "name": name, "method": name.split()[0], "params": {"temperature": t} if t else {}, "temperature": t,
        "speedup_over": over, "lossless": not t, "tokens_per_cycle": 2.0, "model_passes_per_token": 0.5,
        "verifier_passes_per_token": 0.0, "draft_passes_per_token": 0.5, "tokens_per_s": 10.0,
        "engine_ms_per_cycle": 1.0, "speedup_median": 1.5, "speedup_total": 1.4, "agreement": agreement,
        "mean_first_divergence": 3.0, "accuracy": None, "sampling": {"seed": 7} if t else None,
        "by_category": {"c": {"n_prompts": 1, "tokens_per_cycle": 2.0, "speedup_total": 1.4, "speedup_median": 1.5,
                              "agreement": agreement, "accuracy": None}},
    }  # fmt: skip


def test_table_labels_sampled_rows_and_states_greedy_only_once():
    rows = [_row("ar", 0, "ar", 1.0), _row("sd T=0.7", 0.7, "ar T=0.7"), _row("nsd T=0.9", 0.9, "ar")]
    md = render_table(rows, {"prove-lossless": [0.7]})
    line = {r["name"]: next(x for x in md.splitlines() if x.startswith(f"| {r['name']} |")) for r in rows}
    assert "| 100% |" in line["ar"] and "⚠" not in md  # a sampled row's 50% "= AR" is no violation: –
    assert "| – |" in line["sd T=0.7"] and "(vs greedy ar)" not in line["sd T=0.7"]
    assert line["nsd T=0.9"].count("(vs greedy ar)") == 2
    assert "seed 7 + i" in md and md.count("prove-lossless: greedy only, no T=0.7 row") == 1
    cats = render_categories({"categories": [{"name": "c", "n": 1}], "rows": rows})
    assert "| c | 1 | sd T=0.7 |" in cats and "1.40× (vs greedy ar)" in cats


def test_temperature_and_seed_reach_the_decoder(lm, tokenizer, prompts):
    """A T=0.7 row's tokens differ from greedy on some prompt, and repeat exactly with the same seed (the bench's
    per-prompt seed); another seed draws others. Fails if the bench drops the temperature or the seed. (AR here, the
    quickest; the end-to-end run below reruns sd T=0.7.)"""
    from prove.decode.bench.run import build_decoders, row_decoder

    cfg = BenchConfig(model="m", prompts="p", methods=["ar"], temperature=[0, 0.7], max_new_tokens=12, seed=5)
    specs = check_rows(cfg)
    decoders = build_decoders(cfg, specs, {"model": lm, "tokenizer": tokenizer})
    decode_one = row_decoder(cfg, decoders, {})

    def outputs(name: str, offset: int = 0) -> list[list[int]]:
        return [decode_one(name, ids, i, cfg.seed + offset + i).token_ids for i, ids in enumerate(prompts)]

    sampled = outputs("ar T=0.7")
    assert sampled == outputs("ar T=0.7")
    assert sampled != outputs("ar") and sampled != outputs("ar T=0.7", offset=100)


@pytest.mark.slow
def test_bench_sampled_rows_end_to_end(tmp_path, lm, small, tokenizer):
    """A run with ``temperature=[0,0.7]``: sampled rows beside greedy in bench.json / bench.md with their reference,
    prove-lossless greedy only (said once), a rerun gives the same sampled tokens, and the predicted table."""
    from prove.common.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode.bench.run import run_bench

    for name, model, stage in (("mars", lm, "mars"), ("verifier", small, "sft")):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        write_prove_json(
            tmp_path / name, ProveMeta(stage, "tiny-random", 4 if stage == "mars" else None, MASK_TOKEN, mask)
        )
    write_jsonl([as_prompt(r) for r in generate_arithmetic(2, seed=3)], tmp_path / "prompts.jsonl")

    def run(out: str) -> dict:
        cfg = BenchConfig(
            model=str(tmp_path / "mars"), draft=str(tmp_path / "verifier"), prompts=str(tmp_path / "prompts.jsonl"),
            methods=["sd", "prove-lossless"], temperature=[0, 0.7], k=3, max_new_tokens=8, warmup=0, hf=False,
            trace=False, quality=False, plots=False, progress=False, output_dir=str(tmp_path / out),
        )  # fmt: skip
        run_bench(cfg)
        return json.loads((tmp_path / out / "bench.json").read_text())

    report = run("a")
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["ar", "ar T=0.7", "sd", "sd T=0.7", "prove-lossless"]
    assert report["greedy_only"] == {"prove-lossless": [0.7]} and report["lossless_violations"] == []
    assert rows["sd T=0.7"]["speedup_over"] == "ar T=0.7" and rows["ar T=0.7"]["speedup_over"] == "ar"
    assert rows["sd T=0.7"]["params"] == {"k": 3, "draft_threshold": 0.0, "temperature": 0.7}
    assert not rows["sd T=0.7"]["lossless"] and rows["sd"]["lossless"] and rows["sd"]["agreement"] == 1.0
    md = (tmp_path / "a" / "bench.md").read_text()
    assert "| sd T=0.7 |" in md and md.count("prove-lossless: greedy only, no T=0.7 row") == 1
    # the predicted table: greedy rows with per-depth acceptance only, in a section of its own
    pred = report["predicted"]
    assert pred["predicted"] and "Part 4 on the H200" in pred["source"]
    assert [r["name"] for r in pred["rows"]] == ["sd", "prove-lossless"]
    assert "## Predicted on an H200 (from t(w), not measured)" in md
    again = {r["name"]: r for r in run("b")["rows"]}
    for name in ("ar T=0.7", "sd T=0.7"):
        assert [p["text"] for p in again[name]["per_prompt"]] == [p["text"] for p in rows[name]["per_prompt"]]


def test_a_sweep_ar_reads_still_runs_against_its_reference(tmp_path, lm, tokenizer):
    """``fast=[false,true]`` end to end: the bench times both AR rows and finds its reference (it once named them
    ``ar reference`` / ``ar fast`` and failed looking up ``ar`` after loading the models)."""
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode.bench.run import run_bench

    lm.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    write_jsonl([as_prompt(r) for r in generate_arithmetic(1, seed=3)], tmp_path / "prompts.jsonl")
    cfg = BenchConfig(
        model=str(tmp_path / "m"), prompts=str(tmp_path / "prompts.jsonl"), methods=["ar"], fast=[False, True],
        max_new_tokens=4, warmup=0, hf=False, trace=False, quality=False, plots=False, progress=False,
        output_dir=str(tmp_path / "out"),
    )  # fmt: skip
    report = run_bench(cfg)
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"ar", "ar fast"}
    assert rows["ar fast"]["per_prompt"][0]["text"] == rows["ar"]["per_prompt"][0]["text"]  # both greedy AR
    assert rows["ar fast"]["agreement"] == 1.0
