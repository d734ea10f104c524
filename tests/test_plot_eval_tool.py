"""tools/plot_eval.py: curves read from a finished stage's prove.json and from a running one's newest checkpoint."""

from __future__ import annotations

import json

import pytest
from prove.common.checkpoint import ProveMeta, write_prove_json

from tests.tools_helpers import load_tool


def _log(step, tpc8, tpc4, minutes):
    return {
        "step": step,
        "eval_blocks": 10.0,
        "eval_tpc_k8": tpc8,
        "eval_tpc_k4": tpc4,
        "eval_minutes": minutes,
    }


def test_finished_and_running_runs_on_one_figure(tmp_path):
    done = tmp_path / "mars-a"
    done.mkdir()
    history = [_log(10, 2.1, 2.0, 3.0), _log(20, 2.6, 2.4, 6.1), _log(30, 2.5, 2.45, 9.0)]
    meta = ProveMeta(stage="mars", base_model="tiny", block_size=8, extra={"eval": {"history": history}})
    write_prove_json(done, meta)  # the layout training writes
    running = tmp_path / "mars-b"
    for n, logs in ((10, [_log(10, 2.2, 2.1, 2.5)]), (20, [_log(10, 2.2, 2.1, 2.5), {"loss": 3.0, "step": 15},
                                                           _log(20, 2.9, 2.6, 5.0)])):  # fmt: skip
        (running / f"checkpoint-{n}").mkdir(parents=True)
        (running / f"checkpoint-{n}" / "trainer_state.json").write_text(json.dumps({"log_history": logs}))
    tool = load_tool("plot_eval")
    assert tool.history(running)[1] == 8  # K read off the logged keys
    out = tmp_path / "c.png"
    assert tool.main([str(done), str(running), "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    table = out.with_suffix(".md").read_text()
    assert "| mars-a | 8 | 3 | 2.500 (30) | 2.600 (20) |" in table  # last and best differ
    assert "| mars-b | 8 | 2 | 2.900 (20) | 2.900 (20) |" in table  # the newest checkpoint, not the first
    tool.main([str(done), "--k", "4", "--out", str(out)])
    assert "| mars-a | 4 | 3 | 2.450 (30) | 2.450 (30) |" in out.with_suffix(".md").read_text()


def test_a_folder_without_evals_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="neither prove.json nor checkpoint"):
        load_tool("plot_eval").main([str(tmp_path)])
