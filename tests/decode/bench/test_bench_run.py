"""prove-bench, one tiny end-to-end run on random models."""

from __future__ import annotations

import json

import pytest
from prove.decode.bench.config import BenchConfig
from prove.decode.engine.fused import cost_widths

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory, lm, small, tokenizer):
    """A MARS-like checkpoint (K=4) and a verifier/draft with the same tokenizer, plus 2 prompts with answers."""
    from prove.common.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl

    root = tmp_path_factory.mktemp("bench")
    for name, model, stage in (("mars", lm, "mars"), ("verifier", small, "sft")):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        meta = ProveMeta(stage, "tiny-random", 4 if stage == "mars" else None, MASK_TOKEN, mask)
        write_prove_json(root / name, meta)
    write_jsonl([as_prompt(r) for r in generate_arithmetic(2, seed=3)], root / "prompts.jsonl")
    return root


@pytest.mark.slow
def test_bench_end_to_end(bench_dir):
    from prove.decode.bench.run import run_bench

    out = bench_dir / "out"
    cfg = BenchConfig(
        model=str(bench_dir / "mars"),
        verifier=str(bench_dir / "verifier"),
        draft=str(bench_dir / "verifier"),
        prompts=str(bench_dir / "prompts.jsonl"),
        methods=["prove-lossless", "prove", "mars"],
        theta=[0.0, 0.5],
        method_params={"prove-lossless": {"fuse": [False, True], "fuse_groups": ["auto"]}},
        max_new_tokens=10,
        repeats=2,
        output_dir=str(out),
        progress=False,
        quality_model=str(bench_dir / "verifier"),
    )
    run_bench(cfg)
    report = json.loads(
        (out / "bench.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON")
    )
    assert report["schema"] == "prove-bench/1"
    assert {"device", "dtype", "torch", "transformers", "git_commit"} <= report["env"].keys()
    assert report["prompts"] == {"path": cfg.prompts, "suite": None, "n": 2, "with_answers": 2}
    assert report["suites"] is None and report["categories"] == []  # a prompt file without categories
    names = [r["name"] for r in report["rows"]]
    fused = "prove-lossless fused"  # (fuse_groups=auto, the one J: no J in the name)
    assert names == [
        "ar", "hf-greedy", "hf-assisted", "hf-assisted-confidence", "prove-lossless unfused", fused, "prove θ=0",
        "prove θ=0.5", "mars",
    ]  # fmt: skip
    rows = {r["name"]: r for r in report["rows"]}
    keys = {
        "tokens_per_cycle", "model_passes_per_token", "verifier_passes_per_token", "draft_passes_per_token",
        "tokens_per_s", "speedup_median", "speedup_total", "agreement", "first_divergence",
        "mean_first_divergence", "accuracy", "acceptance_by_depth", "tokens_per_cycle_by_position", "per_prompt",
        "params", "lossless",
    }  # fmt: skip
    for row in report["rows"]:
        assert keys <= row.keys()
        assert len(row["per_prompt"]) == 2 and row["accuracy"] is not None
    # lossless rows agree with AR on every prompt; prove with θ = 0 commits whole random blocks and diverges
    for name in ("ar", "hf-greedy", "hf-assisted", "hf-assisted-confidence", "prove-lossless unfused", fused):
        assert rows[name]["agreement"] == 1.0, name
    assert report["lossless_violations"] == []
    assert rows["prove θ=0"]["agreement"] < 1
    assert any(d is not None for d in rows["prove θ=0"]["first_divergence"])
    assert rows["prove θ=0"]["tokens_per_cycle"] > 1 and rows["ar"]["tokens_per_cycle"] == 1
    assert rows["prove-lossless unfused"]["params"] == {"block_size": 4, "draft_threshold": 0.0}
    assert (
        rows["ar"]["path"] == "reference" == rows[fused]["path"]
    )  # fast=auto on the CPU: the reference loop
    # the engine's own time per cycle for our rows, none for transformers'; auto's start-up curve, only on its row
    assert all(rows[n]["engine_ms_per_cycle"] > 0 for n in names if not n.startswith("hf-"))
    assert rows["hf-greedy"]["engine_ms_per_cycle"] is None
    assert [n for n in names if "fuse_cost" in rows[n]] == [fused]
    assert rows[fused]["fuse_cost"]["widths"] == cost_widths(4) and min(rows[fused]["fuse_cost"]["ms"]) > 0
    assert rows["hf-assisted"]["draft_passes_per_token"] > 0
    assert len(rows["prove-lossless unfused"]["acceptance_by_depth"]) == 4
    assert {"p_tilde", "q", "p_tilde_q"} <= report["trace"]["roc"].keys()
    # quality: lossless rows are the target's greedy at every token and score as AR under the quality model
    for name in ("ar", "prove-lossless unfused", fused):
        q = rows[name]["quality"]
        assert q["token_agreement"] == 1.0 and q["loglik_vs_ar"] == pytest.approx(0.0, abs=1e-9), name
    lossy = rows["prove θ=0"]["quality"]
    assert lossy["token_agreement"] < 1 and lossy["loglik_vs_ar"] != pytest.approx(0.0)
    assert rows["ar"]["quality"]["mean_length"] == pytest.approx(
        sum(p["new_tokens"] for p in rows["ar"]["per_prompt"]) / 2
    )
    md = (out / "bench.md").read_text()
    assert all(f"| {n} |" in md for n in names) and "## Quality beside AR" in md
    for name in ("acceptance_by_position", "tokens_per_cycle", "roc", "speed_accuracy", "speed_quality"):
        png = out / f"{name}.png"
        assert report["plots"][name] == str(png) and png.read_bytes()[:8] == PNG


def test_bench_rejects_unknown_method(bench_dir):
    from prove.decode.bench.run import run_bench

    cfg = BenchConfig(
        model=str(bench_dir / "mars"), prompts=str(bench_dir / "prompts.jsonl"), methods=["nope"]
    )
    with pytest.raises(ValueError, match="unknown method"):
        run_bench(cfg)
