"""`make demo` in small: every stage of the tiny pipeline for a few steps (prove-train in subprocesses, as the demo
runs it), then the bench of every method on 2 held-out prompts."""

from __future__ import annotations

import json

import pytest
from prove.recipes import demo


def test_every_stage_runs_through_prove_train(tmp_path):
    """The demo skips nothing itself: prove-train decides (a finished prove.json of the same config is skipped,
    prove.train.rerun), so the demo and every other launch follow one rule."""
    assert not hasattr(demo, "plan") and not hasattr(demo, "done")
    cmd = demo.train_command(demo.STAGES[2], tmp_path, tmp_path / "d.jsonl", ["max_steps=1"])
    assert cmd[1:4] == ["-m", "prove.train.cli", "recipe=tiny"]
    assert cmd[-3:] == ["stage=sft", "stage.role=verifier", "max_steps=1"]


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
    assert all((run_dir / stage.dir / "prove.json").is_file() for stage in demo.STAGES)
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

    assert set(report["plots"]) == set(PLOTS) | {"speed_quality"}  # every row is scored (quality=true)
    for path in report["plots"].values():
        assert path in printed
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
