"""``python -m prove.recipes.gpu_check``: the tiny CPU run end to end (with hydra & co. blocked, so the GPU
machine's torch + transformers suffice), the no-CUDA exit, and the pure parts (prediction, interpolation,
acceptance loading, the method rows)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from prove.recipes import gpu_check as gc
from prove.recipes.gpu_check import curve as gc_curve

from tests.numerics import needs_vector_isa

# What the GPU machine may lack: the check must never import these (matplotlib: it degrades to no plot).
BLOCKED = (
    "hydra",
    "omegaconf",
    "deepspeed",
    "datasets",
    "accelerate",
    "peft",
    "wandb",
    "lm_eval",
    "matplotlib",
)


def _run_blocked(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import sys
        for name in {BLOCKED!r}:
            sys.modules[name] = None  # `import name` now raises ImportError
        from prove.recipes import gpu_check
        rc = gpu_check.main({args!r})
        leaked = [m for m in sys.modules if m.split(".")[0] in {BLOCKED!r} and sys.modules[m] is not None]
        assert not leaked, leaked
        sys.exit(rc)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_tiny_run_needs_only_torch_and_transformers(tmp_path):
    """The whole --tiny run (train, decode, curve, prediction, engine) with hydra, deepspeed, datasets, accelerate,
    matplotlib … unimportable: every check passes, the report is complete, and the plot is skipped with a note."""
    out = tmp_path / "gc"
    proc = _run_blocked(["--tiny", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["ok"] and report["tiny"]
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    assert {"train", "decode", "curve", "prediction"} <= set(report)
    # the plain causal-LM step on the same rows and weights, and MARS / plain (a forgotten baseline, or a ratio taken
    # against the wrong step, fails here): the plain loss is the CE of the labelled tokens, not the MARS loss
    train = report["train"]
    plain, mars = train["plain"], train["runs"]["eager"]
    assert plain["grads_finite"] and len(plain["losses"]) == train["steps"]
    assert plain["losses"][0] != pytest.approx(mars["losses"][0], rel=1e-3)
    assert train["mars_over_plain"]["eager"] == pytest.approx(mars["step_ms"] / plain["step_ms"])
    rows = report["decode"]["dtypes"]["float32"]["rows"]
    assert {"ar", "prove-lossless", "sd", "sd sampling", "nsd sampling"} <= set(rows)
    for name in ("ar", "prove-lossless", "sd"):
        assert rows[name]["agreement"] == 1.0
    # the fast path's later cycles (forced on, so they run here on the CPU too): pard against generate, asd and prove
    # against our reference path; prove's θ cuts blocks (neither whole ones nor y_1 alone), so the comparison bites
    for name in ("ar sampling", "pard", "asd", "prove"):
        assert rows[name]["path"] == "fast", name
    assert rows["pard"]["agreement"] == 1.0
    assert rows["asd"]["agreement_with_reference"] == rows["prove"]["agreement_with_reference"] == 1.0
    assert 1.0 < rows["prove"]["tokens_per_cycle"] < report["decode"]["block_size"]
    assert report["decode"]["dtypes"]["float32"]["distinct_reference_tokens"] > 3  # not one token repeated
    assert set(report["curve"]["ms"]) == {"tiny-s", "tiny-m", "tiny-l"}
    methods = {r["method"] for r in report["prediction"]["rows"]}
    assert {"prove-lossless", "prove-lossless fused", "prove", "sd"} <= methods
    # the shipped acceptance is K = 8: the curve also timed the fused trees of K = 4 and 8 (23 and 79 entries),
    # beyond the tiny ladder's 16
    assert report["prediction"]["widths_added"] == [23, 79] and "79" in report["curve"]["ms"]["tiny-l"]
    fused = {r["size"]: r for r in report["prediction"]["rows"] if r["method"] == "prove-lossless fused"}
    assert fused["K=8"]["passes"] == "t(79)" and math.isfinite(fused["K=8"]["speedup"])
    md = (out / "gpu-check.md").read_text()
    assert "Predicted speedup" in md and "matplotlib is not installed" in md
    assert "| prove | 100% = ours, fast=false |" in md
    assert "| eager | causal (plain step) |" in md and "MARS step / plain causal-LM step" in md
    assert not (out / "cost_curve.png").exists()
    # part 4, engine: every row ran on the same weights; the fast rows took the fast path, one sync a cycle, and
    # the injected acceptance decided their tokens per cycle; the slot cache's t(w) sits beside part 3's
    engine = report["engine"]["shapes"]["tiny-l"]
    rows = engine["rows"]
    assert {"transformers eager", "ours reference ar", "ours fast ar", "ours fast prove-lossless"} <= set(
        rows
    )
    assert rows["ours fast ar"]["path"] == "fast" and rows["ours reference ar"]["path"] == "reference"
    assert rows["ours fast ar"]["agree_with_transformers"] and rows["ours fast ar"]["syncs_per_cycle"] == 1.0
    assert rows["ours fast prove-lossless, 2 tok/cycle injected"]["tokens_per_cycle"] == 2.0
    assert rows["ours fast prove-lossless, 3 tok/cycle injected"]["tokens_per_cycle"] == 3.0
    # compile=true rows (inductor on the CPU here): compiled once in the warm-up, never while timed, the same tokens
    # as transformers in fp32, and the same injected counts as the eager cycle's row
    compiled = rows["ours fast ar compiled"]
    assert compiled["path"].startswith("fast, compiled") and compiled["compiles"] >= 1
    assert compiled["compiles_while_timed"] == 0 and compiled["agree_with_transformers"]
    inj = "ours fast prove-lossless{} 4.5 tok/cycle injected"
    assert rows[inj.format(" compiled,")]["tokens_per_cycle"] == rows[inj.format(",")]["tokens_per_cycle"] > 3
    assert rows[inj.format(" fused compiled,")]["path"].startswith("fast, compiled")
    assert set(engine["graph_curve_ms"]) == set(report["curve"]["ms"]["tiny-l"])
    assert "## 4. Engine against transformers" in md and "| ours fast ar | fast |" in md


@pytest.mark.slow
@needs_vector_isa
def test_tiny_run_with_flex_attention_matches_dense_mask(tmp_path):
    """--tiny --flex: the FlexAttention BlockMask path (compiled; forward only on CPU) gives the dense mask's loss."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    # compile from a clean cache: after another test's shapes torch recompiles flex_attention with dynamic shapes,
    # and inductor's dynamic CPU template fails on a mask_mod that reads a captured tensor (torch 2.13; the GPU
    # path is Triton's)
    torch._dynamo.reset()
    cfg = gc.tiny_config(out=str(tmp_path), flex=True, dense_attn="sdpa", parts=("train",))
    checks: list = []
    result = gc.run_train(cfg, checks)
    assert all(c["ok"] for c in checks), checks
    assert result["runs"]["flex_attention"]["mask"] == "BlockMask"
    assert result["loss_rel_diff"][0] <= 1e-4


def test_without_cuda_the_real_check_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = gc.main(["--out", str(tmp_path / "gc")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "no CUDA device" in err and "--tiny" in err
    assert not (tmp_path / "gc").exists()


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert gc.main(["--tiny", "--parts", "train,bogus", "--out", str(tmp_path)]) == 2
    assert "pick from train,decode,curve" in capsys.readouterr().err
    assert gc.main(["--tiny", "--shapes", "llama-70b", "--out", str(tmp_path)]) == 2
    assert "unknown shape 'llama-70b'" in capsys.readouterr().err
    assert gc.main(["--tiny", "--acceptance", str(tmp_path / "nope.json"), "--out", str(tmp_path)]) == 2
    assert "prove-bench bench.json" in capsys.readouterr().err


def test_predict_from_a_flat_cost_curve():
    """With t(w) flat the speedup is tokens per cycle / passes per cycle; each method's cycle as documented."""
    flat = {w: 10.0 for w in (1, 2, 4, 8, 16, 32, 64)}
    curves = {"big": flat, "verifier": {w: 1.0 for w in flat}, "draft": {w: 1.0 for w in flat}}
    acc = {
        "prove-lossless": [1.0, 0.5, 0.25, 0.0],
        "prove": [1.0, 1.0, 0.5, 0.5],
        "sd": [0.8, 0.6, 0.4, 0.2, 0.1],
    }
    sizes = {"big": 100, "verifier": 10, "draft": 5}
    rows = gc.predict(curves, acc, draft="draft", verifier="verifier", sd_k=5, sizes=sizes)
    got = {(r["target"], r["method"], r["size"]): r for r in rows}
    assert got[("big", "prove-lossless", "K=4")]["speedup"] == pytest.approx(2.75 * 10 / 20)  # t(4) + t(5)
    assert got[("big", "prove-lossless", "K=2")]["tokens_per_cycle"] == pytest.approx(2.5)
    fused = got[("big", "prove-lossless fused", "K=4")]
    assert fused["speedup"] == pytest.approx(1.75) and fused["passes"] == "t(23)"  # one pass: (4+3)(4−1)+2
    assert got[("big", "prove", "K=4")]["speedup"] == pytest.approx(3.0 * 10 / 11)  # t(4) + t_v(5)
    assert got[("big", "sd", "k=5")]["speedup"] == pytest.approx(3.1 * 10 / 15)  # 5·t_d(1) + t(6)
    # a verifier or draft is never predicted against a target no larger than itself
    assert {r["target"] for r in rows if r["method"] == "prove"} == {"big"}
    assert {r["target"] for r in rows if r["method"] == "sd"} == {"big", "verifier"}
    assert ("verifier", "prove-lossless", "K=4") in got


def test_predict_uses_the_measured_widths_only():
    """A fused tree beyond the measured widths has no row (no extrapolation); an interpolated width is linear."""
    curve = {1: 1.0, 2: 2.0, 4: 4.0, 8: 4.0}
    assert gc.interp(curve, 3) == pytest.approx(3.0)
    assert gc.interp(curve, 6) == pytest.approx(4.0)
    assert math.isnan(gc.interp(curve, 9)) and math.isnan(gc.interp(curve, 0.5))
    rows = gc.predict({"m": curve}, {"prove-lossless": [1.0] * 4}, draft=None, verifier=None)
    sizes = {(r["method"], r["size"]) for r in rows}
    # K = 2's tree is 7 wide (within 8), K = 4's 23
    assert ("prove-lossless fused", "K=2") in sizes and ("prove-lossless fused", "K=4") not in sizes
    assert ("prove-lossless", "K=4") in sizes  # t(5) interpolated between t(4) and t(8)
    assert gc.block_sizes_for([1.0] * 8) == [2, 4, 8] and gc.block_sizes_for([1.0] * 5) == [2, 4, 5]


def test_the_fused_width_is_the_real_fused_tree():
    """The predictor's fused pass is the widest tree fuse=true builds (the top of the Decoder's own calibration
    widths), not K² (the tree without the second candidate): 287 entries at K = 16."""
    from prove.decode.engine.fused import cost_widths

    assert [gc.fused_width(k) for k in (2, 4, 8, 16)] == [7, 23, 79, 287]
    assert all(gc.fused_width(k) == cost_widths(k)[-1] for k in range(2, 33))


def test_a_k16_prediction_is_finite_on_the_default_widths():
    """A K = 16 acceptance (the 32B recipe's K): the run's widths reach its fused tree (287, beyond the default
    ladder's 256), so every method gets a finite row at K = 16; the default ladder alone would lose the fused row."""
    acc = {
        "prove-lossless": [1.0 - 0.04 * i for i in range(16)],
        "prove": [1.0 - 0.05 * i for i in range(16)],
        "sd": [0.8, 0.6, 0.4, 0.2, 0.1],
    }
    ladder = gc.CheckConfig().widths
    assert max(ladder) == 256
    widths = gc.curve_widths(ladder, gc.prediction_widths(acc, sd_k=5))
    assert set(ladder) < set(widths) and max(widths) == 287
    assert {16, 17, 287, 6} <= set(gc.prediction_widths(acc, sd_k=5))

    def curve(ws, fixed, per_entry):  # a GPU-like curve: a fixed cost and a small slope
        return {w: fixed + per_entry * w for w in ws}

    curves = {
        "big": curve(widths, 20.0, 0.01),
        "verifier": curve(widths, 5.0, 0.01),
        "draft": curve(widths, 2.0, 0.01),
    }
    rows = gc.predict(
        curves, acc, draft="draft", verifier="verifier", sd_k=5, sizes={"big": 3, "verifier": 2, "draft": 1}
    )
    got = {(r["method"], r["size"]): r for r in rows if r["target"] == "big"}
    for key in (
        ("prove-lossless", "K=16"),
        ("prove-lossless fused", "K=16"),
        ("prove", "K=16"),
        ("sd", "k=5"),
    ):
        assert key in got and math.isfinite(got[key]["speedup"]) and got[key]["speedup"] > 1, key
    assert got[("prove-lossless fused", "K=16")]["passes"] == "t(287)"
    assert got[("prove-lossless fused", "K=16")]["cycle_ms"] == pytest.approx(20.0 + 0.01 * 287)
    short = gc.predict({"big": curve(ladder, 20.0, 0.01)}, acc, draft=None, verifier=None)
    assert ("prove-lossless fused", "K=16") not in {(r["method"], r["size"]) for r in short}


def test_acceptance_from_a_bench_json_and_the_shipped_default(tmp_path):
    bench = {
        "rows": [
            {"name": "ar", "method": "ar", "acceptance_by_depth": []},
            {
                "name": "prove θ=0.05",
                "method": "prove",
                "params": {"theta": 0.05},
                "acceptance_by_depth": [1.0, 0.9],
            },
            {
                "name": "prove θ=0.1",
                "method": "prove",
                "params": {"theta": 0.1},
                "acceptance_by_depth": [1.0, 0.5],
            },
            {"name": "sd", "method": "sd", "acceptance_by_depth": [0.5, None]},
        ]
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    acc = gc.load_acceptance(path)
    assert acc["methods"]["prove"]["acceptance_by_depth"] == [1.0, 0.9]  # the first row of a sweep
    assert acc["methods"]["sd"]["acceptance_by_depth"] == [0.5, 0.0]
    assert "prove-lossless" not in acc["methods"]
    path.write_text(json.dumps({"rows": [bench["rows"][0]]}))
    with pytest.raises(ValueError, match="no per-depth acceptance"):
        gc.load_acceptance(path)
    default = gc.load_acceptance(None)
    lossless = default["methods"]["prove-lossless"]["acceptance_by_depth"]
    assert len(lossless) == 8 and lossless[0] == pytest.approx(1.0)
    assert {"prove", "sd"} <= set(default["methods"]) and len(
        default["methods"]["sd"]["acceptance_by_depth"]
    ) >= 5


def test_the_decode_check_has_a_fused_row():
    """The rows, and the fast path's later cycles forced onto it (on the CPU auto would take the reference path, and
    the tiny run would check nothing of them): fails if a row goes missing or loses ``fast=true``, or the fused row the groups its device cycle runs."""
    specs = gc.decode_specs(4)
    names = [s.name for s in specs]
    assert names == [
        "ar", "prove-lossless", "prove-lossless fused", "sd", "sd sampling", "nsd sampling",
        "ar sampling", "pard", "asd", "prove",
    ]  # fmt: skip
    fused = specs[2]
    assert (
        fused.params == {"block_size": 4, "fuse": True, "fuse_groups": "all"}
        and fused.lossless
        and fused.block
    )
    later = {s.name: s for s in specs[6:]}
    assert all(s.params["fast"] is True for s in later.values())
    assert later["pard"].lossless and later["asd"].against_reference and later["prove"].against_reference
    assert later["prove"].verifier and not later["prove"].draft


def test_a_shape_that_does_not_fit_is_skipped_and_reported(tmp_path, monkeypatch):
    real_fits = gc.fits

    def fits(config, cfg, dtype):
        if config.num_hidden_layers == 4:  # tiny-l
            return False, "40.0 GiB of weights + 2.0 GiB headroom vs 24.0 GiB free"
        return real_fits(config, cfg, dtype)

    monkeypatch.setattr(gc_curve, "fits", fits)
    cfg = gc.tiny_config(out=str(tmp_path), widths=(1, 2), repeats=1, warmup=0)
    checks: list = []
    curve = gc.run_curve(cfg, checks)
    assert set(curve["ms"]) == {"tiny-s", "tiny-m"} and "tiny-l" in curve["skipped"]
    assert all(c["ok"] for c in checks) and len(checks) == 2
    path, note = gc.write_plot(curve, tmp_path)
    assert note is None and path is not None and os.path.getsize(path) > 0


@pytest.mark.slow
def test_tiny_pipeline_runs_the_whole_job_through_make(tmp_path):
    """--parts pipeline --tiny: make train-proposer (sft, then mars killed after its first checkpoint and resumed
    there), make train-verifier, the offload optimizer, prove-decode and prove-bench, on CPU with gloo and zero3 —
    hydra and deepspeed in the launches only, never in this process. Then --from-stage bench reruns the last stage
    alone and reads the earlier ones back."""
    out = tmp_path / "gc"
    proc = _run_blocked(["--tiny", "--parts", "pipeline", "--out", str(out)], tmp_path)
    report = json.loads((out / "gpu-check.json").read_text())
    assert proc.returncode == 0, [c for c in report["checks"] if not c["ok"]]
    stages = report["pipeline"]["stages"]
    assert list(stages) == list(gc.PIPELINE_STAGES) and all(s["ok"] for s in stages.values())
    for name in ("sft", "verifier"):
        assert stages[name]["s_per_step"] > 0 and stages[name]["tokens_per_s"] > 0, stages[name]
        assert stages[name]["peak_rss_gib"] > 0.1
    assert stages["sft"]["steps_logged"] == report["config"]["pipeline"]["sft_steps"]
    mars = stages["mars"]
    # killed after checkpoint 3 (save_steps=3), resumed there, 8 steps in all: the rerun ran only the 5 left
    assert mars["resumed_from_step"] in mars["first_launch"]["killed_after_checkpoints"]
    assert mars["final_step"] == 8 and mars["steps_logged"] == 8 - mars["resumed_from_step"]
    assert stages["cpu-adam"]["rc"] == 0 and stages["decode"]["records"] > 0
    rows = stages["bench"]["float32"]["rows"]
    assert {"ar", "hf-greedy", "prove", "prove-lossless unfused", "prove-lossless fused"} <= set(rows)
    assert all(r["agreement"] == 1.0 for r in rows.values() if r["lossless"])
    md = (out / "gpu-check.md").read_text()
    assert "## 5. Pipeline" in md and "resumed at step" in md and "❌" not in md
    sft_wall = stages["sft"]["wall_s"]

    proc = _run_blocked(
        ["--tiny", "--parts", "pipeline", "--from-stage", "bench", "--out", str(out)], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((out / "gpu-check.json").read_text())["pipeline"]
    assert (
        again["from_stage"] == "bench" and again["stages"]["sft"]["wall_s"] == sft_wall
    )  # read back, not rerun
    log = (out / "pipeline" / "pipeline.log").read_text()
    assert log.count("prove-bench model=") == 2 and log.count("STAGES=sft") == 1


def test_pipeline_numbers_and_from_stage_errors(tmp_path):
    """The Trainer's log lines (after a progress bar's carriage return) give s/step and tokens/s of the launch's last
    run, its first step apart; a step log carrying train_runtime is not the closing one. --from-stage without an earlier run's state is one error, and an unknown
    stage is refused."""
    from prove.recipes.gpu_check.pipeline import last_line, training_numbers

    out = "\n".join(
        [  # verifier SFT (2 steps), then distill (3 steps): the last run's numbers count
            "{'loss': '9.0', 'num_input_tokens_seen': 10, 'train_runtime': '9.0'}",
            "{'loss': '8.0', 'num_input_tokens_seen': 20, 'train_runtime': '9.1'}",
            "{'train_runtime': '9.1', 'train_steps_per_second': '0.2', 'train_loss': '8.5'}",
            " 33%|█| 1/3 [00:00<00:00] {'loss': '5.7', 'num_input_tokens_seen': 1000, 'train_runtime': '2.0'}",
            "\r 67%|█| 2/3 {'loss': '5.6', 'num_input_tokens_seen': 2000, 'train_runtime': '2.25'}",
            "\r 100%|█| 3/3 {'loss': '5.5', 'num_input_tokens_seen': 3000, 'train_runtime': '2.5'}",
            "{'train_runtime': '2.5', 'train_steps_per_second': '1.2', 'train_loss': '5.6'}",
            "gpu-check-peak-rss-kib 1048576",
        ]
    )
    got = training_numbers(out)
    # the first step (compile, warm-up: 2.0 s) apart; then 0.25 s a step and 1000 tokens a step
    assert got["steps_logged"] == 3 and got["first_step_s"] == pytest.approx(2.0)
    assert got["s_per_step"] == pytest.approx(0.25) and got["tokens_per_s"] == pytest.approx(4000)
    assert got["loss_first"] == 5.7 and len(got["runs"]) == 2 and got["runs"][0]["steps_logged"] == 2
    assert got["peak_rss_gib"] == pytest.approx(1.0)
    # a refusal's line is the CLI's own error, not Hydra's or make's closing lines
    refused = (
        "noise\nprove-train: error: no CPU Adam here\nprove-train: (HYDRA_FULL_ERROR=1 shows the traceback)\n"
    )
    assert (
        last_line(refused + "make: *** [Makefile:1: x] Error 2\n") == "prove-train: error: no CPU Adam here"
    )
    assert (
        last_line("ok\nModuleNotFoundError: x\nmake: *** [Makefile:1: x] Error 1\n")
        == "ModuleNotFoundError: x"
    )
    cfg = gc.tiny_config(out=str(tmp_path), parts=("pipeline",), pipeline_from="mars")
    with pytest.raises(ValueError, match="has no result of install, sft: run from an earlier stage"):
        gc.run_pipeline(cfg, [])
    with pytest.raises(ValueError, match="--from-stage nope: pick from install,sft,mars"):
        gc.tiny_config(parts=("pipeline",), pipeline_from="nope")


def test_the_gpu_pipelines_overrides_compose_for_every_stage(tmp_path):
    """The real (GPU) pipeline's prove-train overrides — bf16, FlexAttention, the Qwen2.5-0.5B body — compose and
    validate for every launch it makes, so a typo in the settings the CPU never runs fails here, not on the device."""
    from prove.recipes.gpu_check.pipeline import train_overrides

    from tests.train.helpers import train_config

    cfg = gc.CheckConfig(parts=("pipeline",))
    base = ["recipe=tiny", *train_overrides(cfg, tmp_path)]
    for stage in (["stage=sft"], ["stage=mars"], ["stage=sft", "stage.role=verifier"], ["stage=distill"]):
        c = train_config([*base, *stage])
        assert c.trainer.bf16 and c.model.attn_implementation == "flex_attention", stage
        assert c.trainer.extra["include_num_input_tokens_seen"] == "all"
        assert c.deepspeed["zero_optimization"]["stage"] == 3
    mars = train_config([*base, "stage=mars"])
    assert (
        mars.model.scratch.hidden == 896 and mars.model.scratch.layers == 24 and mars.trainer.max_steps == 30
    )
    offload = train_config([*base, "stage=sft", "deepspeed=zero3_offload_optimizer", "max_steps=2"])
    assert not offload.deepspeed["optimizer"]["params"]["torch_adam"]  # the GPU run builds CPU Adam
