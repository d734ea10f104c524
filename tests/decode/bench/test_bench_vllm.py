"""prove-bench's vLLM rows (``backend=vllm``): the pure numbers on hand-made data (vLLM's acceptance length kept
apart from our tokens per cycle, the crossover along the concurrency sweep), the config's checks, and one short run
on a tiny random model with vLLM's rows beside ours in one report."""

from __future__ import annotations

import json
import math

import pytest
from prove.decode.bench.config import BenchConfig
from prove.decode.bench.metrics import PromptRun, crossover, vllm_summary
from prove.decode.config import VllmOptions
from prove.decode.methods import resolve_params


def _ref(*outputs: list[int]) -> list[PromptRun]:
    return [PromptRun(id=i, token_ids=t, text="", wall_s=1.0, cycles=len(t), model_passes=len(t)) for i, t in
            enumerate(outputs)]  # fmt: skip


def test_vllm_summary_keeps_vllms_acceptance_length_apart_from_tokens_per_cycle():
    # two requests: 6 tokens in 3 steps (the prefill step's token, then 2 drafting steps committing 2 + 3: 3
    # drafts accepted), and 4 tokens in 4 steps, one of which drafted and had nothing accepted
    stats = [
        {"cycles": 3, "drafts": 2, "accepted_tokens": 3, "accepted_by_depth": [2, 1], "proposed_by_depth": [2, 2]},
        {"cycles": 4, "drafts": 1, "accepted_tokens": 0, "accepted_by_depth": [0, 0], "proposed_by_depth": [1, 1]},
    ]  # fmt: skip
    out = vllm_summary(
        [[1, 2, 3, 4, 5, 6], [7, 8, 9, 9]], stats, ["a", "b"], 2.0, _ref([1, 2, 3, 4, 5, 6], [7, 8, 0, 0])
    )
    assert out["tokens_per_s"] == 5.0 and out["tokens_per_cycle"] == 10 / 7
    assert out["mean_acceptance_length"] == 1 + 3 / 3  # vLLM's: over its 3 drafting steps only
    assert out["agreement"] == 0.5 and out["first_divergence"] == [None, 2]
    assert out["acceptance_by_depth"] == [2 / 3, 1 / 3]
    ar = vllm_summary([[1]], [{"cycles": 1}], ["x"], 1.0, _ref([1]))
    assert ar["mean_acceptance_length"] is None and ar["tokens_per_cycle"] == 1.0


def test_crossover_is_where_speculation_falls_to_the_baseline():
    cs = [1, 2, 4, 8, 16]
    cross = crossover(cs, [200, 300, 400, 400, 500], [100, 180, 300, 400, 800])
    assert cross["last_win"] == 4 and cross["first_loss"] == 8
    # ratio 4/3 at c = 4 and 1 at c = 8: the crossing lies at c = 8 (log2 interpolation lands on the point)
    assert math.isclose(cross["estimate"], 8.0)
    mid = crossover([4, 16], [300, 300], [200, 600])  # ratios 1.5 and 0.5: halfway in log2, at c = 8
    assert math.isclose(mid["estimate"], 8.0)
    assert crossover(cs, [2, 2, 2, 2, 2], [1, 1, 1, 1, 1]) is None  # pays everywhere
    assert crossover(cs, [1, 1, 1, 1, 1], [2, 2, 2, 2, 2]) == {
        "last_win": None,
        "first_loss": 1,
        "estimate": None,
    }


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"backend": "VLLM"}, "pick one of engine, vllm"),
        (
            {"backend": "vllm", "vllm_methods": ["mars"]},
            r"vLLM runs ar, prove-lossless, sd, pard, prove, nsd, asd",
        ),
        ({"backend": "vllm", "vllm_concurrency": [0, 2]}, "requests in flight ≥ 1"),
        ({"backend": "vllm", "vllm_concurrency": [512]}, "raise vllm.max_num_seqs"),
    ],
)
def test_bad_vllm_settings_fail_at_start(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(model="m", prompts="p", **kw)


def test_the_concurrency_sweep_is_sorted_and_the_default_reaches_64():
    cfg = BenchConfig(model="m", prompts="p", backend="vllm", vllm_concurrency=[8, 1, 4, 1])
    assert cfg.vllm_concurrency == [1, 4, 8]
    assert BenchConfig(model="m", prompts="p", backend="vllm").vllm_concurrency == [1, 2, 4, 8, 16, 32, 64]


def test_each_point_of_a_rules_sweep_is_a_row_of_one_engine():
    """vllm_engines (pure): one engine a method, started with the first K / k; a row per point of the rule's sweep,
    named as our rows are (only swept values), carrying the values its requests send; method_params over the shared
    keys, their keys vLLM does not read left to our rows."""
    from prove.decode.bench.rows import RowSpec
    from prove.decode.bench.vllm_rows import VllmEngine, vllm_engines

    sweeps = {"theta": [0.3, 0.5], "block_size": [2, 4], "k": None, "fuse": None}
    mp = {"prove": {"theta": [0.1, 0.2], "fuse": False}, "asd": {"budget": [0.0, 8.0], "gate": 0.5}}
    engines = vllm_engines(["ar", "prove", "nsd", "asd", "prove-lossless"], sweeps, mp)
    assert engines[0] == VllmEngine("ar", {}, (RowSpec("vllm ar", "ar", {}),))
    prove, nsd, asd, lossless = engines[1:]
    assert prove.name == "vllm prove" and prove.params == {"block_size": 2}  # one K an engine
    assert prove.rows == (
        RowSpec("vllm prove θ=0.1", "prove", {"theta": 0.1}),
        RowSpec("vllm prove θ=0.2", "prove", {"theta": 0.2}),
    )
    assert [(r.name, r.params) for r in nsd.rows] == [
        ("vllm nsd θ=0.3", {"theta": 0.3}),
        ("vllm nsd θ=0.5", {"theta": 0.5}),
    ]  # the shared θ: nsd's nucleus mass
    assert nsd.params == {}  # k: the method's default
    assert [(r.name, r.params) for r in asd.rows] == [
        ("vllm asd B=0", {"budget": 0.0, "gate": 0.5}),
        ("vllm asd B=8", {"budget": 8.0, "gate": 0.5}),
    ]
    assert lossless.params == {"block_size": 2} and lossless.rows == (
        RowSpec("vllm prove-lossless", "prove-lossless", {}),
    )
    one = vllm_engines(["prove"], {"theta": 0.1}, None)
    assert one[0].rows == (RowSpec("vllm prove", "prove", {"theta": 0.1}),)  # a single value: no label
    with pytest.raises(ValueError, match="repeats a row"):
        vllm_engines(["prove"], {"theta": [0.1, 0.1]})
    with pytest.raises(ValueError, match="theta=-1"):  # every point checked by the method's own checks
        vllm_engines(["nsd"], {"theta": [0.5, -1.0]})


def test_vllm_method_params_narrow_the_vllm_sweep():
    from prove.decode.bench.vllm_rows import plan
    from prove.recipes import demo

    kw = dict(
        model="m", prompts="p", verifier="v", draft="d", backend="vllm", vllm_methods=["ar", "prove", "nsd"]
    )
    mp = {"prove": {"theta": [0.05, 0.1, 0.2]}, "nsd": {"theta": [0.8, 0.9]}}
    default = BenchConfig(**kw, method_params=mp)
    assert default.vllm_method_params is None
    assert [r.name for e in plan(default) for r in e.rows] == [
        "vllm ar", "vllm prove θ=0.05", "vllm prove θ=0.1", "vllm prove θ=0.2", "vllm nsd θ=0.8", "vllm nsd θ=0.9",
    ]  # fmt: skip
    narrow = BenchConfig(
        **kw, method_params=mp, vllm_method_params={"prove": {"theta": [0.1], "block_size": 4}}
    )
    prove, nsd = plan(narrow)[1:]
    assert prove.params == {"block_size": 4} and [(r.name, r.params) for r in prove.rows] == [
        ("vllm prove", {"theta": 0.1})
    ]
    assert [r.params for r in nsd.rows] == [{"theta": 0.8}, {"theta": 0.9}]  # not named: method_params still
    # the demo: our prove rows sweep THETAS, vLLM's prove row runs θ = 0.1 only
    demo_cfg = BenchConfig(
        **kw, method_params={"prove": {"theta": list(demo.THETAS)}},
        vllm_method_params={"prove": {"theta": list(demo.VLLM_THETAS)}},
    )  # fmt: skip
    assert [(r.name, r.params) for r in plan(demo_cfg)[1].rows] == [("vllm prove", {"theta": 0.1})]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"vllm_method_params": {"asd": {"budget": [0, 8]}}}, r"names method 'asd', which is not in vllm_methods"),
        ({"vllm_method_params": {"prove": {"tau": [0.9]}}}, r"vLLM prove reads \['block_size', 'theta'\] .*not \['tau'\]"),
        ({"vllm_method_params": {"ar": {"theta": 0.1}}}, r"vLLM ar reads no parameter"),
        ({"vllm_method_params": {"prove": {"block_size": [2, 4]}}}, "fixed when its engine starts.*give one value"),
        ({"vllm_method_params": {"prove": {"theta": [0.1, -0.5]}}}, "theta=-0.5 must be ≥ 0"),
        ({"vllm_method_params": {"prove": [0.1]}}, "must map a method to its params"),
        ({"backend": "engine", "vllm_method_params": {"prove": {"theta": [0.1]}}}, "add backend=vllm"),
    ],
)  # fmt: skip
def test_bad_vllm_method_params_fail_at_start(kw, match):
    base = dict(model="m", prompts="p", verifier="v", backend="vllm", vllm_methods=["ar", "prove"])
    with pytest.raises(ValueError, match=match):
        BenchConfig(**{**base, **kw})


def test_crossover_table_and_plot_per_row_of_one_method(tmp_path):
    """Two vLLM prove rows of one engine: a crossover each, a table line each, the engine's line naming both, a
    line each in the plot."""
    from prove.decode.bench.plots import plot_vllm_concurrency
    from prove.decode.bench.report import render_vllm_table
    from prove.decode.bench.vllm_rows import crossovers

    def row(name, method, c, tps):
        return {"name": name, "method": method, "concurrency": c, "in_flight": c, "tokens_per_s": tps,
                "params": {"theta": 0.1} if method == "prove" else {}, "vs_vllm_ar": None, "agreement": 1.0,
                "mean_acceptance_length": None, "tokens_per_cycle": 1.0, "accuracy": None}  # fmt: skip

    rows = [row("vllm ar", "ar", 1, 100), row("vllm ar", "ar", 8, 400)]
    rows += [row("vllm prove θ=0.1", "prove", 1, 200), row("vllm prove θ=0.1", "prove", 8, 300)]
    rows += [row("vllm prove θ=0.4", "prove", 1, 250), row("vllm prove θ=0.4", "prove", 8, 500)]
    cross = crossovers(rows, [1, 8])
    assert cross == {
        "vllm prove θ=0.1": {
            "last_win": 1,
            "first_loss": 8,
            "estimate": cross["vllm prove θ=0.1"]["estimate"],
        },
        "vllm prove θ=0.4": None,  # pays at both
    }
    engines = {
        "vllm ar": {"method": "ar", "startup_s": 3.0, "rows": ["vllm ar"]},
        "vllm prove": {"method": "prove", "startup_s": 4.0, "rows": ["vllm prove θ=0.1", "vllm prove θ=0.4"]},
    }
    md = render_vllm_table({"engines": engines, "rows": rows, "crossover": cross})
    assert (
        "| vllm prove θ=0.1 | θ=0.1 | 8 | 300.0 |" in md and "| vllm prove θ=0.4 | θ=0.1 | 1 | 250.0 |" in md
    )
    assert "- vllm ar: engine start-up 3.0 s\n" in md
    # below 100% = AR: a ⚠ for a lossless method only (prove is lossy by design)
    diverged = [dict(r, agreement=0.97) for r in (row("vllm ar", "ar", 1, 100), rows[2])]
    flagged = render_vllm_table({"engines": engines, "rows": diverged, "crossover": {}})
    assert "| 97% ⚠ |" in flagged.split("| vllm ar |")[1].split("\n")[0]
    assert "⚠" not in flagged.split("| vllm prove θ=0.1 |")[1].split("\n")[0]
    assert "- vllm prove: engine start-up 4.0 s, one engine for vllm prove θ=0.1, vllm prove θ=0.4" in md
    assert (
        "- vllm prove θ=0.1 stops paying between 1 and 8" in md and "- vllm prove θ=0.4 beats vLLM ar" in md
    )
    vllm = {"engines": engines, "rows": rows, "crossover": cross}
    png = plot_vllm_concurrency({"vllm": vllm, "rows": []}, tmp_path / "vllm_concurrency.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    old = {"engines": {"vllm ar": {"method": "ar", "startup_s": 3.0}}, "rows": rows[:2], "crossover": {}}
    assert "- vllm ar: engine start-up 3.0 s" in render_vllm_table(
        old
    )  # a bench.json from before rows per engine


def test_the_plugin_methods_get_their_engines_by_composition(monkeypatch):
    """vLLM prove / nsd / asd engines (``prove.decode.vllm.plugin``): prove drafts with the model for the verifier, an
    engine is started with K / k only (the rule's values go per request: ``row_sampling``), a missing verifier or
    draft skips the engine saying why, and a lossy row differing from our ar is no violation (a lossless one is)."""
    from prove.decode.bench import vllm_rows
    from prove.decode.config import VllmOptions

    cfg = BenchConfig(
        model="m", prompts="p", verifier="v", draft="d", backend="vllm", theta=[0.3, 0.5],
        method_params={"prove": {"theta": [0.1, 0.2]}}, vllm_methods=["ar", "prove", "nsd", "asd"],
        vllm=VllmOptions(kv_cache_gb=0.25),
    )  # fmt: skip
    seen = []

    class Fake:
        def __init__(self, model, *, method, draft, verifier, **kw):
            seen.append((method, model, draft, verifier, kw))
            self.params = resolve_params(method, **{k: v for k, v in kw.items() if k in ("block_size", "k")})[
                1
            ]
            self.engine_args = {}

        def close(self):
            pass

    monkeypatch.setattr("prove.decode.vllm.backend.VllmDecoder", Fake)
    engines, records = vllm_rows.start_engines(cfg)
    assert [s[:4] for s in seen] == [
        ("ar", "m", None, None), ("prove", "m", None, "v"), ("nsd", "m", "d", None), ("asd", "m", "d", None)
    ]  # fmt: skip
    assert all(
        kw == {"device": "cpu", "dtype": "float32", "options": cfg.vllm} for *_, kw in seen
    )  # no θ, no K
    assert records["vllm prove"]["params"] == {"block_size": None}
    assert records["vllm prove"]["rows"] == ["vllm prove θ=0.1", "vllm prove θ=0.2"]
    assert records["vllm asd"]["params"] == {"k": 5} and records["vllm asd"]["rows"] == ["vllm asd"]
    prove_rows = vllm_rows.plan(cfg)[1].rows
    sampling = vllm_rows.row_sampling(engines["vllm prove"], prove_rows[1])
    assert sampling.theta == 0.2 and sampling.temperature == 0.0  # the engine's params, the row's θ
    assert vllm_rows.row_sampling(engines["vllm ar"], vllm_rows.plan(cfg)[0].rows[0]) is None
    bare = BenchConfig(model="m", prompts="p", backend="vllm", vllm_methods=["ar", "prove"])
    seen.clear()
    _, skipped = vllm_rows.start_engines(bare)
    assert skipped["vllm prove"] == {"method": "prove", "skipped": "needs verifier="}
    lossy = {"method": "prove", "params": {"theta": 0.1}}
    assert not vllm_rows._lossless(lossy) and vllm_rows._lossless({"method": "sd", "params": {"k": 3}})
    assert vllm_rows._lossless({"method": "asd", "params": {"budget": 0.0}})
    assert (
        "prove" in BenchConfig(model="m", prompts="p").vllm_methods
    )  # make bench: a vLLM prove row wherever a verifier is given


VLLM_THETAS = (3e-4, 0.02)
"""The vLLM prove rows' θ: each at least 0.1% from every p̃·q our engine meets (checked), the gate cutting blocks at
varied depths at the first, mostly at d₁ at the second (tests/decode/test_vllm_rules.py's pair)."""


@pytest.mark.slow
def test_vllm_rows_beside_ours_in_one_report(tmp_path, qwen2_factory, tokenizer, monkeypatch):
    """vLLM ar and prove (the MARS model drafting for a perturbed copy, its verifier) at 1 and 4 requests in flight:
    ar gives our ar's tokens on every prompt; one prove engine serves a row per θ of ``vllm_method_params``, each
    request carrying its θ, and each row's output is our engine's prove at that θ (after vLLM's first token, the
    verifier's: docs/vllm.md, "The first token"); vLLM's acceptance length on the drafting rows, a crossover per row,
    the table, the plot; sd without a draft is skipped, saying why."""
    pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")
    import dataclasses

    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode import Decoder
    from prove.decode.bench.run import run_bench
    from prove.decode.vllm.backend import VllmDecoder

    from tests.decode.conftest import save_checkpoint
    from tests.decode.test_draft import perturbed

    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)  # head size 32
    model = qwen2_factory(len(tokenizer) + 8, seed=11, eos_token_id=tokenizer.eos_token_id, **kw)
    mars = save_checkpoint(tmp_path / "mars", model, tokenizer)
    verifier = save_checkpoint(tmp_path / "verifier", perturbed(model, 0.08, seed=5), tokenizer, stage="sft")
    write_jsonl([as_prompt(r) for r in generate_arithmetic(5, seed=3)], tmp_path / "prompts.jsonl")
    sent: dict[
        tuple[float | None, int | None], dict[int, object]
    ] = {}  # (θ, in flight) → vLLM prove's results
    prompt_ids: list[list[int]] = []
    generate_many = VllmDecoder.generate_many

    def spy(self, prompts, *args, concurrency=None, sampling=None, **kwargs):
        prompt_ids[:] = [list(p) for p in prompts]
        for i, result in generate_many(
            self, prompts, *args, concurrency=concurrency, sampling=sampling, **kwargs
        ):
            if self.method.name == "prove":
                sent.setdefault((sampling and sampling.theta, concurrency), {})[i] = result
            yield i, result

    monkeypatch.setattr(VllmDecoder, "generate_many", spy)
    counted = iter(range(0, 10**6, 3))  # vLLM's preemption counter, 3 more at every read
    monkeypatch.setattr(VllmDecoder, "preemptions", lambda self: next(counted))
    out = tmp_path / "out"
    cfg = BenchConfig(
        model=mars,
        verifier=verifier,
        prompts=str(tmp_path / "prompts.jsonl"),
        methods=["prove-lossless"],
        max_new_tokens=12,
        hf=False,
        trace=False,
        output_dir=str(out),
        progress=False,
        backend="vllm",
        vllm_methods=["ar", "sd", "prove"],
        vllm_method_params={"prove": {"theta": list(VLLM_THETAS)}},
        vllm_concurrency=[1, 4],
        vllm=VllmOptions(max_num_seqs=8, kv_cache_gb=0.25, max_model_len=512),
    )
    run_bench(cfg)
    report = json.loads((out / "bench.json").read_text())
    vllm = report["vllm"]
    assert vllm["engines"]["vllm sd"] == {"method": "sd", "skipped": "needs draft="}
    names = [f"vllm prove θ={t:g}" for t in VLLM_THETAS]
    assert vllm["engines"]["vllm prove"]["params"] == {"block_size": 4}  # one engine, θ per request
    assert vllm["engines"]["vllm prove"]["rows"] == names
    rows = {(r["name"], r["concurrency"]): r for r in vllm["rows"]}
    assert list(rows) == [("vllm ar", 1), ("vllm ar", 4)] + [(n, c) for n in names for c in (1, 4)]
    for row in rows.values():
        assert row["n_prompts"] == 5 and row["tokens_per_s"] > 0
        assert row["preemptions"] == 3  # the timed run's own count, not the engine's total
    assert rows["vllm ar", 1]["agreement"] == rows["vllm ar", 4]["agreement"] == 1.0
    assert (
        vllm["violations"] == [] and report["lossless_violations"] == []
    )  # vLLM prove is lossy: no violation
    ours = Decoder(mars, method="prove", verifier=verifier, trace=True)
    for theta, name in zip(VLLM_THETAS, names, strict=True):
        ours.params = dataclasses.replace(ours.params, theta=theta)
        for c in (1, 4):
            got = sent[theta, c]
            row = rows[name, c]
            assert row["params"] == {"block_size": 4, "theta": theta}
            assert [p["text"] for p in row["per_prompt"]] == [
                got[i].text for i in range(5)
            ]  # this θ's outputs
            for i, prompt in enumerate(prompt_ids):
                ids = got[i].token_ids
                want = ours.generate(prompt + ids[:1], max_new_tokens=11)
                assert ids == ids[:1] + want.token_ids, (theta, c, i)  # the verifier's first token, then ours
                scores = [
                    c * q
                    for r in want.stats.trace
                    for c, q in zip(r["conf"], r["verifier_prob"], strict=True)
                ]
                assert min(abs(s / theta - 1) for s in scores) > 1e-3, (theta, i)  # no p̃·q at θ's float edge
    assert [sent[VLLM_THETAS[0], 4][i].token_ids for i in range(5)] != [
        sent[VLLM_THETAS[1], 4][i].token_ids for i in range(5)
    ]  # θ changes the output: the rows are told apart
    pl, ar = rows[names[0], 4], rows["vllm ar", 4]
    assert pl["mean_acceptance_length"] > 1 and pl["drafts"] > 0 and ar["mean_acceptance_length"] is None
    assert ar["tokens_per_cycle"] == 1.0 and ar["vs_vllm_ar"] == 1.0 and pl["in_flight"] == 4
    assert set(vllm["crossover"]) == set(names)
    md = (out / "bench.md").read_text()
    assert "## vLLM (backend=vllm)" in md and f"| {names[1]} | K=4 θ=0.02 | 4 |" in md
    assert "| preempted⁷ |" in md and "requests vLLM preempted during the timed run" in md
    assert "- vllm prove: engine start-up" in md and f"one engine for {names[0]}, {names[1]}" in md
    assert "vLLM's mean acceptance length" in md and "vllm sd: skipped (needs draft=)" in md
    assert (out / "vllm_concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
