"""`make demo` in small: every stage of the tiny pipeline for a few steps (prove-train in subprocesses, as the demo
runs it), then the bench of every method on 2 held-out prompts; a rerun finds every stage done."""

from __future__ import annotations

import json

import pytest
from prove.recipes import demo


def test_plan_skips_finished_stages(tmp_path):
    assert [todo for _, todo in demo.plan(tmp_path)] == [True] * 4
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "checkpoint-100").mkdir()  # an interrupted stage is not done
    assert demo.plan(tmp_path)[0][1] is True
    (tmp_path / "sft" / "prove.json").write_text("{}")
    assert [todo for _, todo in demo.plan(tmp_path)] == [False, True, True, True]
    cmd = demo.train_command(demo.STAGES[2], tmp_path, tmp_path / "d.jsonl", ["max_steps=1"])
    assert cmd[1:4] == ["-m", "prove.train.cli", "recipe=tiny"]
    assert cmd[-3:] == ["stage=sft", "stage.role=verifier", "max_steps=1"]


def test_a_skipped_stage_cut_short_by_its_cap_is_named(tmp_path):
    from prove.decode.checkpoint import ProveMeta, write_prove_json

    (tmp_path / "mars").mkdir()
    write_prove_json(tmp_path / "mars", ProveMeta(stage="mars", base_model="sft", block_size=8))
    assert demo.cut_short(tmp_path / "mars") is None  # every step ran
    early = {"reason": "max_minutes", "step": 55, "max_steps": 300, "max_minutes": 5.0,
             "setting": "stages.proposer.mars.max_minutes"}  # fmt: skip
    meta = ProveMeta(stage="mars", base_model="sft", block_size=8, extra={"stopped_early": early})
    write_prove_json(tmp_path / "mars", meta)
    note = demo.cut_short(tmp_path / "mars")
    assert (
        note is not None
        and "step 55 of 300" in note
        and "--train-arg stages.proposer.mars.max_minutes=" in note
    )


@pytest.mark.slow
def test_smoke_demo(tmp_path, capsys):
    run_dir, out = tmp_path / "runs", tmp_path / "bench"
    argv = [
        "--smoke",
        "--run-dir",
        str(run_dir),
        "--data",
        str(tmp_path / "data" / "train.jsonl"),
        "--out",
        str(out),
    ]
    assert demo.main(argv) == 0
    printed = capsys.readouterr().out
    assert "$ prove-train recipe=tiny" in printed and "$ prove-bench model=" in printed
    assert [todo for _, todo in demo.plan(run_dir)] == [False] * 4  # a rerun goes straight to the bench
    report = json.loads((out / "bench.json").read_text())
    methods = {r["method"] for r in report["rows"]}
    assert {
        "ar",
        "hf-greedy",
        "hf-assisted",
        "mars",
        "prove",
        "prove-lossless",
        "sd",
        "nsd",
        "asd",
    } <= methods
    assert sum(r["method"] == "prove" for r in report["rows"]) == len(demo.THETAS)
    assert "| prove-lossless unfused |" in printed and "| prove-lossless fused J=all |" in printed
    assert report["pass_cost"]["widths"] == list(range(1, 9)) and "Pass cost t(w)/t(1)" in printed
    from prove.decode.bench.plots import PLOTS

    assert set(report["plots"]) == set(PLOTS)
    for path in report["plots"].values():
        assert path in printed
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
