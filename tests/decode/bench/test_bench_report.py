"""prove-bench, the Markdown table and the plots."""

from __future__ import annotations

from prove.decode.bench.report import render_table

from tests.decode.decode_helpers import hand_report, table_row

PNG = b"\x89PNG\r\n\x1a\n"


def test_render_table():
    md = render_table(
        [
            table_row("ar", 1.0, True, engine_ms_per_cycle=0.4123),
            table_row("prove", 0.5, False, accuracy=None),
        ]
    )
    lines = md.splitlines()
    assert lines[0].startswith("| method | params | tok/cycle¹")
    assert lines[2] == (
        "| ar | θ=0.1 | 3.25 | 0.31 | – | – | 120.0 | 0.412 | 2.00× | 1.90× | 100% | – | 90.0% |"
    )
    # every row has the header's cells (a cell without a column once shifted nothing and rendered a stray "–")
    assert {line.count(" | ") for line in lines[:4] if not line.startswith("|-")} == {lines[0].count(" | ")}
    assert (
        "| prove |" in lines[3] and "| 120.0 | – | 2.00× |" in lines[3] and "| 50% | 4.5 | n/a |" in lines[3]
    )
    assert "counting the correction / bonus token" in md
    assert "⚠" not in md
    flagged = render_table([table_row("prove-lossless", 0.75, True)])
    assert "75% ⚠" in flagged and "a lossless method disagreed" in flagged


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
