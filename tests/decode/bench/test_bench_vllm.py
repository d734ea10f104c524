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


def test_the_plugin_methods_get_their_rows_by_composition(monkeypatch):
    """vLLM prove / nsd / asd rows (``prove.decode.vllm.plugin``): prove drafts with the model for the verifier, the
    rule's parameters are the first of their sweeps, a missing verifier or draft skips the row saying why, and a
    lossy row differing from our ar is no violation (a lossless one is)."""
    from prove.decode.bench import vllm_rows
    from prove.decode.config import VllmOptions

    cfg = BenchConfig(
        model="m", prompts="p", verifier="v", draft="d", backend="vllm", theta=[0.3, 0.5],
        method_params={"prove": {"theta": [0.1, 0.2]}}, vllm_methods=["ar", "prove", "nsd", "asd"],
        vllm=VllmOptions(kv_cache_gb=0.25),
    )  # fmt: skip
    assert vllm_rows.vllm_params(cfg, "prove") == {"theta": 0.1}  # block_size: the trained K (None)
    assert vllm_rows.vllm_params(cfg, "nsd") == {"theta": 0.3}
    assert set(vllm_rows.vllm_params(cfg, "asd")) == set()  # defaults: budget, gate, max_mismatches unset
    seen = []

    class Fake:
        def __init__(self, model, *, method, draft, verifier, **kw):
            seen.append((method, model, draft, verifier, kw))
            self.params = resolve_params(method, **{k: v for k, v in kw.items() if k in ("theta", "k")})[1]
            self.engine_args = {}

        def close(self):
            pass

    monkeypatch.setattr("prove.decode.vllm.backend.VllmDecoder", Fake)
    engines, records = vllm_rows.start_engines(cfg)
    assert [s[:4] for s in seen] == [
        ("ar", "m", None, None), ("prove", "m", None, "v"), ("nsd", "m", "d", None), ("asd", "m", "d", None)
    ]  # fmt: skip
    assert records["vllm prove"]["params"] == {"block_size": None, "theta": 0.1}
    assert records["vllm asd"]["params"] == {"k": 5, "budget": 8.0, "gate": 0.25, "max_mismatches": 2}
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


@pytest.mark.slow
def test_vllm_rows_beside_ours_in_one_report(tmp_path, qwen2_factory, tokenizer):
    """vLLM ar and prove-lossless at 1 and 4 requests in flight: our ar's tokens on every prompt, vLLM's acceptance
    length on the drafting row, the table, the plot; sd without a draft is skipped, saying why."""
    pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode.bench.run import run_bench

    from tests.decode.conftest import save_checkpoint

    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)  # head size 32
    model = qwen2_factory(len(tokenizer) + 8, seed=11, eos_token_id=tokenizer.eos_token_id, **kw)
    mars = save_checkpoint(tmp_path / "mars", model, tokenizer)
    write_jsonl([as_prompt(r) for r in generate_arithmetic(5, seed=3)], tmp_path / "prompts.jsonl")
    out = tmp_path / "out"
    cfg = BenchConfig(
        model=mars,
        prompts=str(tmp_path / "prompts.jsonl"),
        methods=["prove-lossless"],
        max_new_tokens=12,
        hf=False,
        trace=False,
        output_dir=str(out),
        progress=False,
        backend="vllm",
        vllm_concurrency=[1, 4],
        vllm=VllmOptions(max_num_seqs=8, kv_cache_gb=0.25, max_model_len=512),
    )
    run_bench(cfg)
    report = json.loads((out / "bench.json").read_text())
    vllm = report["vllm"]
    assert vllm["engines"]["vllm sd"] == {"method": "sd", "skipped": "needs draft="}
    assert vllm["engines"]["vllm prove-lossless"]["params"] == {"block_size": 4}
    rows = {(r["name"], r["concurrency"]): r for r in vllm["rows"]}
    assert sorted(rows) == [
        ("vllm ar", 1),
        ("vllm ar", 4),
        ("vllm prove-lossless", 1),
        ("vllm prove-lossless", 4),
    ]
    for row in rows.values():
        assert row["agreement"] == 1.0 and row["n_prompts"] == 5 and row["tokens_per_s"] > 0
    assert vllm["violations"] == [] and report["lossless_violations"] == []
    pl, ar = rows["vllm prove-lossless", 4], rows["vllm ar", 4]
    assert pl["mean_acceptance_length"] > 1 and pl["drafts"] > 0 and ar["mean_acceptance_length"] is None
    assert ar["tokens_per_cycle"] == 1.0 and ar["vs_vllm_ar"] == 1.0 and pl["in_flight"] == 4
    assert set(vllm["crossover"]) == {"vllm prove-lossless"}
    md = (out / "bench.md").read_text()
    assert "## vLLM (backend=vllm)" in md and "| vllm prove-lossless | K=4 | 4 |" in md
    assert "vLLM's mean acceptance length" in md and "vllm sd: skipped (needs draft=)" in md
    assert (out / "vllm_concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
