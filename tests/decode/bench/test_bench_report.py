"""prove-bench, the Markdown table and the plots."""

from __future__ import annotations

import math

from prove.decode.bench.metrics import (
    auc,
    roc_curve,
)
from prove.decode.bench.report import render_table

PNG = b"\x89PNG\r\n\x1a\n"


def table_row(name, agreement, lossless, **kw):
    row = {
        "name": name, "method": name, "params": {"theta": 0.1}, "swept": {}, "lossless": lossless,
        "tokens_per_cycle": 3.25, "model_passes_per_token": 0.31, "verifier_passes_per_token": 0.0,
        "draft_passes_per_token": math.nan, "tokens_per_s": 120.0, "speedup_median": 2.0, "speedup_total": 1.9,
        "agreement": agreement, "mean_first_divergence": None if agreement == 1 else 4.5, "accuracy": 0.9,
    }  # fmt: skip
    row.update(kw)
    return row


def test_render_table():
    md = render_table([table_row("ar", 1.0, True), table_row("prove", 0.5, False, accuracy=None)])
    lines = md.splitlines()
    assert lines[0].startswith("| method | params | tok/cycle¹")
    assert lines[2].startswith(
        "| ar | θ=0.1 | 3.25 | 0.31 | – | – | 120.0 | 2.00× | 1.90× | 100% | – | 90.0% |"
    )
    assert "| prove |" in lines[3] and "| 50% | 4.5 | n/a |" in lines[3]
    assert "counting the correction / bonus token" in md
    assert "⚠" not in md
    flagged = render_table([table_row("prove-lossless", 0.75, True)])
    assert "75% ⚠" in flagged and "a lossless method disagreed" in flagged


def hand_report() -> dict:
    curve = {"bin_size": 4, "start": [0, 4, 8], "mean": [3.0, 2.5, 2.0], "cycles": [2, 2, 2]}
    rows = [
        table_row("ar", 1.0, True, method="ar", accuracy=0.8, speedup_total=1.0, acceptance_by_depth=[],
                  tokens_per_cycle_by_position={**curve, "mean": [1.0, 1.0, 1.0]}),
        table_row("prove θ=0.1", 0.9, False, method="prove", swept={"theta": 0.1}, accuracy=0.8,
                  acceptance_by_depth=[1.0, 0.7, 0.4, 0.2], tokens_per_cycle_by_position=curve),
        table_row("prove θ=0.3", 1.0, False, method="prove", swept={"theta": 0.3}, accuracy=0.85,
                  speedup_total=1.4, acceptance_by_depth=[1.0, 0.5, 0.2, 0.1], tokens_per_cycle_by_position=curve),
        table_row("hf-greedy", 1.0, True, method="hf-greedy", speedup_total=None, acceptance_by_depth=[],
                  tokens_per_cycle_by_position={"bin_size": 4, "start": [], "mean": [], "cycles": []}),
    ]  # fmt: skip
    fpr, tpr, _ = roc_curve([0.9, 0.8, 0.4, 0.3, 0.2], [True, True, False, True, False])
    roc = {"auc": auc(fpr, tpr), "fpr": fpr.tolist(), "tpr": tpr.tolist()}
    trace = {"block_size": 4, "positions": 5, "match_by_depth": [1.0, 0.8, 0.6, 0.5], "roc": {"p_tilde": roc}}
    return {"rows": rows, "trace": trace, "prompts": {"n": 2, "with_answers": 2}}


def test_every_plot_is_written(tmp_path):
    from prove.decode.bench.plots import PLOTS, write_plots

    paths = write_plots(hand_report(), tmp_path)
    assert set(paths) == set(PLOTS)
    for path in paths.values():
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG
    # a report without trace data or block methods still plots (with a note)
    bare = {"rows": [hand_report()["rows"][0]], "trace": None, "prompts": {"n": 1, "with_answers": 0}}
    bare_paths = write_plots(bare, tmp_path / "bare")
    assert set(bare_paths) == set(PLOTS)
    for path in bare_paths.values():
        assert path.read_bytes()[:8] == PNG
