"""prove-bench: the pure parts on hand-made data (divergence, ROC/AUC, per-depth rates, aggregation, rows,
table), the config, the plots, and one tiny end-to-end run on random models (slow)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hydra.errors import ConfigCompositionException
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.metrics import (
    PromptRun,
    auc,
    first_divergence,
    rate_by_depth,
    roc_curve,
    roc_table,
    summarize,
    tokens_per_cycle_by_position,
    trace_points,
)
from prove.decode.bench.report import render_table
from prove.decode.bench.rows import RowSpec, expand_rows, is_lossless

PNG = b"\x89PNG\r\n\x1a\n"


# -- first divergence -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "ref", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([1, 2, 9, 4], [1, 2, 3, 4], 2),
        ([5], [1], 0),
        ([1, 2], [1, 2, 3], 2),  # stopped early: diverges where the shorter one ends
        ([1, 2, 3], [1, 2], 2),
        ([], [7], 0),
    ],
)
def test_first_divergence(out, ref, expected):
    assert first_divergence(out, ref) == expected


# -- ROC / AUC ---------------------------------------------------------------------------------------------


def mann_whitney(scores, labels) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie), by brute force."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_roc_perfect_reversed_and_uninformative():
    labels = [True, True, False, False]
    fpr, tpr, thr = roc_curve([0.9, 0.8, 0.3, 0.1], labels)
    assert auc(fpr, tpr) == 1.0
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1)
    assert thr[0] == np.inf and list(thr[1:]) == [0.9, 0.8, 0.3, 0.1]
    fpr, tpr, _ = roc_curve([0.1, 0.2, 0.8, 0.9], labels)
    assert auc(fpr, tpr) == 0.0
    fpr, tpr, _ = roc_curve([0.5] * 4, labels)  # one tie group: a single diagonal step
    assert fpr.tolist() == [0, 1] and tpr.tolist() == [0, 1]
    assert auc(fpr, tpr) == 0.5


def test_roc_hand_example():
    # thresholds 0.9, 0.7, 0.4 (a tie of one positive and one negative), 0.2
    fpr, tpr, thr = roc_curve([0.9, 0.7, 0.4, 0.4, 0.2], [True, False, True, False, True])
    assert thr[1:].tolist() == [0.9, 0.7, 0.4, 0.2]
    assert tpr.tolist() == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 1])
    assert fpr.tolist() == pytest.approx([0, 0, 0.5, 1, 1])
    assert auc(fpr, tpr) == pytest.approx(mann_whitney([0.9, 0.7, 0.4, 0.4, 0.2], [1, 0, 1, 0, 1]))


def test_auc_equals_mann_whitney_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.integers(0, 6, size=40) / 5  # many ties
        labels = rng.random(40) < 0.4 + 0.1 * scores
        labels[0], labels[1] = True, False
        fpr, tpr, _ = roc_curve(scores.tolist(), labels.tolist())
        assert auc(fpr, tpr) == pytest.approx(mann_whitney(scores.tolist(), labels.tolist()))
        assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def test_roc_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        roc_curve([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="same length"):
        roc_curve([0.1, 0.2], [True])


# -- per-depth rates, tokens per cycle along the response ------------------------------------------------


def test_rate_by_depth_ragged():
    hits = [[3, 2, 0], [1], []]
    totals = [[3, 3, 3], [1], []]
    assert rate_by_depth(hits, totals) == [1.0, 2 / 3, 0.0]
    assert rate_by_depth([], []) == []
    with pytest.raises(ValueError, match="different lengths"):
        rate_by_depth([[1, 0]], [[1]])


def test_tokens_per_cycle_by_position():
    # request 1: cycles start at 0 (1 token), 1 (3), 4 (4); request 2: at 0 (2), 2 (2)
    starts, means, counts = tokens_per_cycle_by_position([[1, 3, 4], [2, 2]], bin_size=4)
    assert starts == [0, 4]
    assert means == [2.0, 4.0]
    assert counts == [4, 1]
    with pytest.raises(ValueError):
        tokens_per_cycle_by_position([[1]], bin_size=0)


# -- aggregation -------------------------------------------------------------------------------------------


def run(tokens, wall, cycles, passes, text="", **kw) -> PromptRun:
    return PromptRun(
        id=None, token_ids=tokens, text=text, wall_s=wall, cycles=cycles, model_passes=passes, **kw
    )


def test_summarize_hand_numbers():
    ar = [run([1, 2, 3, 4], 4.0, 4, 4, "The answer is 4."), run([5, 6], 2.0, 2, 2, "The answer is 7.")]
    fast = [
        run([1, 2, 3, 4], 1.0, 2, 2, "The answer is 4.", verifier_passes=2, committed_per_cycle=[3, 1]),
        run([5, 9], 2.0, 1, 1, "The answer is 9.", verifier_passes=1, committed_per_cycle=[2]),
    ]
    s = summarize(fast, ar, ["4", "9"])
    assert s["tokens_per_cycle"] == 2.0  # 6 tokens / 3 cycles
    assert s["model_passes_per_token"] == 0.5 and s["verifier_passes_per_token"] == 0.5
    assert s["draft_passes_per_token"] == 0
    assert s["speedup_median"] == pytest.approx((4.0 + 1.0) / 2)  # per-prompt tokens/s ratios 4× and 1×
    assert s["speedup_total"] == pytest.approx((6 / 3.0) / (6 / 6.0))
    assert s["first_divergence"] == [None, 1]  # the agreement column sees the divergence
    assert s["agreement"] == 0.5 and s["mean_first_divergence"] == 1
    assert s["accuracy"] == 1.0  # scored with prove.data.synthetic.score
    assert s["tokens_per_cycle_by_position"]["mean"] == [2.0]
    same = summarize(ar, ar, [None, None])
    assert same["agreement"] == 1.0 and same["speedup_total"] == 1.0 and same["accuracy"] is None
    custom = summarize(fast, ar, ["x", "y"], scorer=lambda text, answer: answer == "x")
    assert custom["accuracy"] == 0.5


def test_summarize_rejects_mismatched_prompts():
    with pytest.raises(ValueError, match="same prompts"):
        summarize([run([1], 1.0, 1, 1)], [])


def test_trace_points_and_roc_table():
    rows = [
        {"conf": [0.9, 0.8, 0.2], "verifier_prob": [0.9, 0.1, 0.3], "matched": [True, True, False]},
        {"conf": [0.7, 0.1], "verifier_prob": [0.6, 0.5], "matched": [True, False]},
        {"conf": [0.5], "verifier_prob": None, "matched": None},  # no target scores: skipped
    ]
    pts = trace_points([rows, None])
    assert pts["depth"] == [0, 1, 2, 0, 1]
    assert pts["matched"] == [True, True, False, True, False]
    roc = roc_table(pts)
    assert set(roc) == {"p_tilde", "q", "p_tilde_q"}
    assert roc["p_tilde"]["auc"] == 1.0
    assert roc["q"]["auc"] == pytest.approx(mann_whitney([0.9, 0.1, 0.3, 0.6, 0.5], pts["matched"]))
    no_q = trace_points([[{"conf": [0.9, 0.1], "verifier_prob": None, "matched": [True, False]}]])
    assert set(roc_table(no_q)) == {"p_tilde"}
    assert roc_table(trace_points([[{"conf": [0.9], "matched": [True]}]])) == {}  # one class: no curve


# -- rows, table, config -----------------------------------------------------------------------------------

USES = {
    "ar": (),
    "mars": ("tau", "block_size"),
    "prove": ("theta", "block_size"),
    "prove-lossless": ("block_size",),
}


def test_expand_rows_sweeps_and_ar_first():
    rows = expand_rows(
        ["prove", "mars", "ar", "prove"], {"theta": [0.1, 0.3], "tau": None, "block_size": 4}, USES
    )
    assert [r.name for r in rows] == ["ar", "prove θ=0.1", "prove θ=0.3", "mars"]
    assert rows[1] == RowSpec("prove θ=0.1", "prove", {"theta": 0.1, "block_size": 4})
    assert rows[3].params == {"block_size": 4}
    grid = expand_rows(["prove"], {"theta": [0.1, 0.2], "block_size": [2, 4]}, USES)
    assert [r.name for r in grid][1:] == [
        "prove θ=0.1 K=2",
        "prove θ=0.1 K=4",
        "prove θ=0.2 K=2",
        "prove θ=0.2 K=4",
    ]
    with pytest.raises(ValueError, match="repeats"):
        expand_rows(["prove"], {"theta": [0.1, 0.1]}, USES)
    with pytest.raises(ValueError, match="empty sweep"):
        expand_rows(["prove"], {"theta": []}, USES)


def test_expand_rows_method_params():
    uses = {**USES, "nsd": ("k", "theta")}
    rows = expand_rows(["prove", "nsd"], {"theta": 0.2, "k": None}, uses, {"prove": {"theta": [0.05, 0.1]}})
    assert [(r.name, r.params) for r in rows] == [
        ("ar", {}),
        ("prove θ=0.05", {"theta": 0.05}),
        ("prove θ=0.1", {"theta": 0.1}),
        ("nsd", {"theta": 0.2}),  # the shared value still applies to the other reader of θ
    ]
    with pytest.raises(ValueError, match="does not read"):
        expand_rows(["prove"], {}, uses, {"prove": {"tau": 0.9}})
    with pytest.raises(ValueError, match="not in methods"):
        expand_rows(["prove"], {}, uses, {"mars": {"tau": 0.9}})


def test_is_lossless():
    assert (
        is_lossless("ar", {})
        and is_lossless("prove-lossless", {"block_size": 4})
        and is_lossless("sd", {"k": 5})
    )
    assert not is_lossless("prove", {"theta": 0.0}) and not is_lossless("mars", {})
    assert is_lossless("asd", {"budget": 0.0, "gate": 0.25}) and not is_lossless(
        "asd", {"budget": 8.0, "gate": 0.25}
    )


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


def test_config_composes_with_list_overrides():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.bench.config import register_configs

    register_configs()
    with initialize_config_module(config_module="prove.conf.decode", version_base=None):
        cfg = compose(
            "bench",
            ["model=m", "prompts=p.jsonl", "theta=[0.05,0.1]", "methods=[ar,prove]", "tau=0.9",
             "method_params={prove:{block_size:[2,4]}}"],
        )  # fmt: skip
        bad = pytest.raises(ConfigCompositionException, match="'thetta'")
        with bad:
            compose("bench", ["model=m", "prompts=p", "thetta=0.1"])
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, BenchConfig)
    assert config.theta == [0.05, 0.1] and config.tau == 0.9 and config.methods == ["ar", "prove"]
    assert config.method_params == {"prove": {"block_size": [2, 4]}}
    assert config.sweeps() == {
        "theta": [0.05, 0.1], "tau": 0.9, "block_size": None, "k": None, "fuse": None, "fuse_groups": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match="max_new_tokens"):
        BenchConfig(model="m", prompts="p", max_new_tokens=0)


# -- plots -------------------------------------------------------------------------------------------------


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


# -- a tiny end-to-end run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory, lm, small, tokenizer):
    """A MARS-like checkpoint (K=4) and a verifier/draft with the same tokenizer, plus 2 prompts with answers."""
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json

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
        max_new_tokens=10,
        repeats=2,
        output_dir=str(out),
        progress=False,
    )
    run_bench(cfg)
    report = json.loads(
        (out / "bench.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON")
    )
    assert report["schema"] == "prove-bench/1"
    assert {"device", "dtype", "torch", "transformers", "git_commit"} <= report["env"].keys()
    assert report["prompts"] == {"path": cfg.prompts, "n": 2, "with_answers": 2}
    names = [r["name"] for r in report["rows"]]
    assert names == ["ar", "hf-greedy", "hf-assisted", "prove-lossless", "prove θ=0", "prove θ=0.5", "mars"]
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
    for name in ("ar", "hf-greedy", "hf-assisted", "prove-lossless"):
        assert rows[name]["agreement"] == 1.0, name
    assert report["lossless_violations"] == []
    assert rows["prove θ=0"]["agreement"] < 1
    assert any(d is not None for d in rows["prove θ=0"]["first_divergence"])
    assert rows["prove θ=0"]["tokens_per_cycle"] > 1 and rows["ar"]["tokens_per_cycle"] == 1
    assert rows["prove-lossless"]["params"] == {"block_size": 4}
    assert rows["hf-assisted"]["draft_passes_per_token"] > 0
    assert len(rows["prove-lossless"]["acceptance_by_depth"]) == 4
    assert {"p_tilde", "q", "p_tilde_q"} <= report["trace"]["roc"].keys()
    md = (out / "bench.md").read_text()
    assert all(f"| {n} |" in md for n in names)
    for name in ("acceptance_by_position", "tokens_per_cycle", "roc", "speed_accuracy"):
        png = out / f"{name}.png"
        assert report["plots"][name] == str(png) and png.read_bytes()[:8] == PNG


def test_bench_rejects_unknown_method(bench_dir):
    from prove.decode.bench.run import run_bench

    cfg = BenchConfig(
        model=str(bench_dir / "mars"), prompts=str(bench_dir / "prompts.jsonl"), methods=["nope"]
    )
    with pytest.raises(ValueError, match="unknown method"):
        run_bench(cfg)


# -- hf_compare: ours vs transformers on random weights of a named shape -------------------------------------


def test_paired_speedup():
    from prove.decode.bench.metrics import PromptRun, paired_speedup

    ours = [PromptRun(0, [1, 2], "", 1.0, 1, 1), PromptRun(1, [3], "", 2.0, 1, 1)]
    theirs = [PromptRun(0, [1, 2], "", 1.5, 2, 2), PromptRun(1, [3], "", 2.0, 1, 1)]
    got = paired_speedup(ours, theirs)
    assert got["per_prompt"] == [1.5, 1.0] and got["median"] == 1.25 and got["total"] == 3.5 / 3.0
    assert got["identical"]
    assert not paired_speedup(ours, [theirs[0], PromptRun(1, [4], "", 2.0, 1, 1)])["identical"]


def test_hf_compare_config_checks():
    cfg = BenchConfig(hf_compare="tiny")
    assert cfg.methods == ["ar", "sd"] and cfg.model is None
    with pytest.raises(ValueError, match="not a known shape"):
        BenchConfig(hf_compare="qwen9")
    with pytest.raises(ValueError, match="drop model="):
        BenchConfig(hf_compare="tiny", model="m")
    with pytest.raises(ValueError, match="drop \\['prove'\\]"):
        BenchConfig(hf_compare="tiny", methods=["ar", "prove"])
    with pytest.raises(ValueError, match="pass model="):
        BenchConfig(prompts="p")


def test_random_draft_is_a_layer_cut_of_the_target():
    import torch
    from prove.decode.random_models import random_target_and_draft

    target, draft = random_target_and_draft("tiny", 2)
    assert len(draft.model.layers) == 2 and draft.model.layers[1] is target.model.layers[1]
    assert draft.lm_head.weight is target.model.embed_tokens.weight  # tied, shared
    ids = torch.arange(10)[None]
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[2]  # after the target's first 2 layers
        expect = target.lm_head(target.model.norm(h))
        torch.testing.assert_close(draft(ids).logits, expect)
    with pytest.raises(ValueError, match="draft_layers=4"):
        random_target_and_draft("tiny", 4)
    # deep_scale shrinks only the layers the draft skips
    shrunk, _ = random_target_and_draft("tiny", 2, deep_scale=0.5)
    for i, layer in enumerate(shrunk.model.layers):
        factor = 0.5 if i >= 2 else 1.0
        torch.testing.assert_close(
            layer.mlp.down_proj.weight, factor * target.model.layers[i].mlp.down_proj.weight
        )


def test_hf_compare_runs_on_the_tiny_shape(tmp_path):
    """The mode of ``prove-bench hf_compare=qwen2.5-0.5b`` end to end on the tiny shape: ours and transformers'
    rows produce identical tokens and the report carries the paired ratios."""
    from prove.decode.bench.run import run_bench

    out = tmp_path / "cmp"
    cfg = BenchConfig(hf_compare="tiny", draft_layers=2, n_prompts=2, prompt_len=12, max_new_tokens=10,
                      output_dir=str(out), plots=False, progress=False)  # fmt: skip
    report = run_bench(cfg)
    assert [r["name"] for r in report["rows"]] == ["ar", "hf-greedy", "hf-assisted", "sd"]
    assert report["lossless_violations"] == []
    rows = {r["name"]: r for r in report["rows"]}
    assert all(r["new_tokens"] == 20 for r in report["rows"])  # no EOS: every request runs max_new_tokens
    assert rows["sd"]["draft_passes_per_token"] > 0 and rows["hf-assisted"]["draft_passes_per_token"] > 0
    hfc = report["hf_compare"]
    for pair in ("ar_vs_hf-greedy", "sd_vs_hf-assisted"):
        assert hfc[pair]["identical"] and hfc[pair]["median"] > 0 and len(hfc[pair]["per_prompt"]) == 2
    md = (out / "bench.md").read_text()
    assert "hf_compare (tiny shape, 2-layer draft): ar vs hf-greedy:" in md and "identical" in md
