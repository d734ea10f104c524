"""prove-bench's predicted table: the H200 t(w) curves committed as package data, a hand-computed prediction per
row (K against K + 1, the fused tree's width), the table labelled predicted, and the one copy of the arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prove.decode.bench import predicted as pr
from prove.decode.bench.report import render_predicted, render_table

SMALL = {1: 1.0, 8: 1.7, 64: 2.0, 256: 3.0}
BIG = {1: 2.0, 8: 9.0, 64: 16.0, 256: 40.0}


@pytest.fixture
def curves_file(tmp_path):
    doc = {
        "device": "NVIDIA H200", "measured": "2026-12-04", "source": "a hand-made curve", "conditions": "none",
        "unit": "ms",
        "shapes": {
            "small": {"label": "small shape", "params_b": 1, "ms": {str(w): v for w, v in SMALL.items()}},
            "big": {"label": "big shape", "params_b": 10, "ms": {str(w): v for w, v in BIG.items()}},
        },
    }  # fmt: skip
    path = tmp_path / "curves.json"
    path.write_text(json.dumps(doc))
    return path


def row(name, method, tpc, acc_len=4, temperature=0.0, **params):
    return {"name": name, "method": method, "params": params, "temperature": temperature,
            "tokens_per_cycle": tpc, "acceptance_by_depth": [0.5] * acc_len}  # fmt: skip


def test_hand_computed_prediction_per_row(curves_file):
    rows = [
        row("ar", "ar", 1.0, acc_len=0),
        row("prove-lossless unfused", "prove-lossless", 2.75, block_size=4, fuse=False),
        row("prove-lossless fused", "prove-lossless", 3.0, block_size=4, fuse=True, fuse_groups="auto"),
        row("prove-lossless fused K=16", "prove-lossless", 3.0, acc_len=16, block_size=16, fuse=True),
        row("sd", "sd", 2.5, acc_len=3, k=3),
        row("sd T=0.7", "sd", 2.0, acc_len=3, temperature=0.7, k=3),  # sampled: no prediction
        row("prove", "prove", 2.0, block_size=4, theta=0.1),
        row("mars", "mars", 2.0, block_size=4),  # no cost model here
    ]
    sec = pr.predicted_section(rows, curves_file)
    assert sec["predicted"] and sec["source"] == "a hand-made curve" and sec["helper"] == "small"
    got = {r["name"]: r for r in sec["rows"]}
    assert list(got) == [
        "prove-lossless unfused",
        "prove-lossless fused",
        "prove-lossless fused K=16",
        "sd",
        "prove",
    ]
    big = {n: (r["by_shape"]["big"] or {}).get("speedup") for n, r in got.items()}
    small = {n: (r["by_shape"]["small"] or {}).get("speedup") for n, r in got.items()}
    # unfused K = 4: t(4) + t(5) = 5 + 6 on the big curve (t(K) + t(K) or t(K+1) + t(K+2) would give 10 or 13)
    assert got["prove-lossless unfused"]["passes"] == "t(4) + t(5)"
    assert big["prove-lossless unfused"] == pytest.approx(2.75 * 2.0 / 11.0)
    assert small["prove-lossless unfused"] == pytest.approx(2.75 * 1.0 / (1.3 + 1.4))
    # fused K = 4: one pass over (4 + 3)(4 − 1) + 2 = 23 entries, t(23) = 9 + 15 · 7/56 (K² = 16 would give 10)
    assert got["prove-lossless fused"]["passes"] == "t(23)"
    assert big["prove-lossless fused"] == pytest.approx(3.0 * 2.0 / 10.875)
    # K = 16's tree, 287 wide, lies beyond the curve's 256: no number, not an extrapolation
    assert got["prove-lossless fused K=16"]["by_shape"] == {"small": None, "big": None}
    # sd, k = 3: 3 draft steps on the small shape's t(1) and the target's t(4); none on the small shape itself
    assert got["sd"]["size"] == "k=3" and big["sd"] == pytest.approx(2.5 * 2.0 / (3 * 1.0 + 5.0))
    assert small["sd"] is None and small["prove"] is None
    # prove, K = 4: the target's t(4) and the verifier's t_v(5)
    assert big["prove"] == pytest.approx(2.0 * 2.0 / (5.0 + 1.4))


def test_the_table_is_labelled_predicted_and_apart(curves_file):
    rows = [row("prove-lossless", "prove-lossless", 2.75, block_size=4)]
    sec = pr.predicted_section(rows, curves_file)
    md = render_predicted(json.loads(json.dumps(sec)))  # as read back from bench.json (string widths)
    assert md.startswith("\n## Predicted on an H200 (from t(w), not measured)")
    assert "| big shape: predicted speedup |" in md and "a hand-made curve" in md
    assert f"{2.75 * 2.0 / 11.0:.2f}×" in md
    assert render_predicted({"rows": []}) == "" and render_predicted(None) == ""
    measured = render_table(
        [{**rows[0], "model_passes_per_token": 0.5, "verifier_passes_per_token": 0, "draft_passes_per_token": 0,
          "tokens_per_s": 1.0, "speedup_median": 1.1, "speedup_total": 1.2, "agreement": 1.0,
          "mean_first_divergence": None, "accuracy": None, "lossless": True}]
    )  # fmt: skip
    assert "predicted" not in measured.lower() and f"{2.75 * 2.0 / 11.0:.2f}×" not in measured


def test_the_committed_h200_curves_are_docs_gpu_md_part_4():
    doc = pr.load_curves()
    assert doc["device"] == "NVIDIA H200" and doc["measured"] == "2026-12-04"
    assert (
        "Part 4 on the H200" in doc["source"] and "512" in doc["conditions"] and "bf16" in doc["conditions"]
    )
    ms = {s: spec["ms"] for s, spec in doc["shapes"].items()}
    assert ms == {
        "qwen2.5-0.5b": {1: 2.70, 8: 3.17, 64: 3.40, 256: 3.79},
        "qwen2.5-7b": {1: 7.11, 8: 7.94, 64: 8.33, 256: 10.56},
        "qwen2.5-32b": {1: 23.3, 8: 25.6, 64: 28.1, 256: 40.8},
    }


def test_one_copy_and_a_light_import():
    """gpu_check's prediction is this module's; importing it pulls in nothing beyond the standard library (the GPU
    machine has only torch and transformers)."""
    import importlib

    gc_predict = importlib.import_module(
        "prove.recipes.gpu_check.predict"
    )  # the package re-exports `predict`
    for name in ("interp", "block_sizes_for", "fused_width", "predict"):
        assert getattr(gc_predict, name) is getattr(pr, name)
    code = (
        "import sys; import prove.decode.bench.predicted; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'numpy', 'hydra', 'omegaconf', 'datasets')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
