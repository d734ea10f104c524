"""vLLM 0.32's batch-size schedule of K (``num_speculative_tokens_per_batch_size``) with parallel drafting (docs/vllm.md,
"Under load"): a lossless method's engine gets our drafter (``ScheduledDrafter``, its slots laid out per scheduled K,
installed through the worker class), so each request verifies its own drafts at every K; the plugin methods take a
schedule of K ≥ 1 (at K = 0 vLLM's target would answer the step), their drafter laying out its slots the same way."""

from __future__ import annotations

import warnings

import pytest
from prove.decode.config import VllmOptions
from prove.decode.vllm.backend import VllmDecoder

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

SCHEDULE = [[1, 2, 4], [3, 256, 2]]


def test_a_k_schedule_with_parallel_drafting_installs_our_drafter(checkpoints):
    """Fails if a schedule reaches vLLM's own drafter (rows misassigned) or a plugin method accepts one."""
    mars = checkpoints["mars"]
    spec = {"method": "draft_model", "model": mars, "num_speculative_tokens": 4, "parallel_drafting": True}
    schedule = {**spec, "num_speculative_tokens_per_batch_size": SCHEDULE}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plan = VllmDecoder(
            mars, start=False, options=VllmOptions(engine_args={"speculative_config": schedule})
        )
        assert plan.engine_args["speculative_config"] == schedule  # passed on as asked
        assert plan.engine_args["worker_cls"] == "prove.decode.vllm.plugin.RuleCPUWorker"
        assert plan.engine_args["additional_config"]["prove_rule"] == {"method": "prove-lossless"}
        assert "scheduler_cls" not in plan.engine_args  # vLLM's own scheduler runs its own schedule
        static = VllmDecoder(mars, start=False)  # the static K: vLLM as it is
        assert "worker_cls" not in static.engine_args
        sd = {"method": "draft_model", "model": mars, "num_speculative_tokens": 3}
        seq = VllmDecoder(mars, start=False, options=VllmOptions(engine_args={"speculative_config": {**sd, "num_speculative_tokens_per_batch_size": [[1, 256, 2]]}}))  # fmt: skip
        assert "worker_cls" not in seq.engine_args  # sequential drafting runs any K as it is
    prove = VllmDecoder(
        mars,
        method="prove",
        verifier=checkpoints["verifier"],
        start=False,
        options=VllmOptions(engine_args={"speculative_config": schedule}),
    )  # the plugin's own drafter follows the schedule; its rule settings stay
    assert prove.engine_args["additional_config"]["prove_rule"]["method"] == "prove"
    assert prove.engine_args["scheduler_cls"].endswith("RuleScheduler")
    with pytest.raises(ValueError, match="method=prove on vLLM takes a K schedule with K ≥ 1 only"):
        VllmDecoder(
            mars,
            method="prove",
            verifier=checkpoints["verifier"],
            start=False,
            options=VllmOptions(
                engine_args={
                    "speculative_config": {
                        **schedule,
                        "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 256, 0]],
                    }
                }
            ),  # fmt: skip
        )


def test_vllm_k_schedule_is_one_knob_for_the_lossless_methods(checkpoints):
    """``vllm.k_schedule`` (prove-serve: ``k_schedule=``) reaches every speculative engine's config (``prove`` too,
    with K ≥ 1); a K above the engine's, or a malformed entry, is a ValueError naming the fix. Fails if the knob is
    dropped, or is passed on unchecked."""
    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    options = VllmOptions(k_schedule=SCHEDULE)
    plan = VllmDecoder(mars, start=False, options=options)
    assert plan.engine_args["speculative_config"]["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert plan.engine_args["worker_cls"].endswith("RuleCPUWorker")  # parallel drafting: our drafter
    sd = VllmDecoder(mars, method="sd", draft=mars, k=4, start=False, options=options)
    assert sd.engine_args["speculative_config"]["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert "worker_cls" not in sd.engine_args
    prove = VllmDecoder(mars, method="prove", verifier=verifier, start=False, options=options)
    assert prove.engine_args["speculative_config"]["num_speculative_tokens_per_batch_size"] == SCHEDULE
    with pytest.raises(ValueError, match="vllm.k_schedule asks K=8, more than the engine's 4"):
        VllmDecoder(mars, start=False, options=VllmOptions(k_schedule=[[1, 256, 8]]))
    with pytest.raises(ValueError, match=r"vllm.k_schedule entry \[4, 2, 1\] must be \[first, last, K\]"):
        VllmOptions(k_schedule=[[4, 2, 1]])


def test_prove_serve_takes_the_k_schedule(checkpoints):
    """One server for every load: ``prove-serve k_schedule=...`` passes the schedule and our drafter to vLLM."""
    import json

    from prove.decode.vllm.serve import ServeConfig, server_argv

    argv, _ = server_argv(
        ServeConfig(model=checkpoints["mars"], method="prove-lossless", k_schedule=SCHEDULE)
    )
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert argv[argv.index("--worker-cls") + 1] == "prove.decode.vllm.plugin.RuleCPUWorker"
    assert json.loads(argv[argv.index("--additional-config") + 1]) == {
        "prove_rule": {"method": "prove-lossless"}
    }


def test_the_tokens_a_skipped_drafter_missed_are_refed_once_in_order():
    """``MissedTokens`` (what ``ScheduledDrafter`` feeds its drafter after passes skipped at K = 0): a step's drafts
    the target rejected are dropped where the next step starts, and a resumed request's recompute supersedes what it
    covers. Fails if rejected drafts are re-fed as if committed, a position is fed twice or out of order, or a
    finished request's tokens are kept."""
    import torch
    from prove.decode.vllm.plugin import MissedTokens

    missed = MissedTokens()
    ids = torch.tensor
    missed.add(
        "a", ids([10, 11, 12, 13]), ids([5, 6, 7, 8])
    )  # a verify step: 11 accepted, 12 and 13 rejected
    missed.add("a", ids([20]), ids([7]))  # the next step starts at the correction token's position
    missed.add("b", ids([30, 31]), ids([0, 1]))
    assert missed.refeed("a", 8) == ([10, 11, 20], [5, 6, 7])
    assert missed.refeed("a", 8) == ([10, 11, 20], [5, 6, 7])  # kept until cleared
    missed.add(
        "a", ids([1, 2, 3, 4, 5, 6, 7, 8]), ids([0, 1, 2, 3, 4, 5, 6, 7])
    )  # preempted, recomputed from 0
    assert missed.refeed("a", 8) == ([1, 2, 3, 4, 5, 6, 7, 8], list(range(8)))
    assert missed.refeed("a", 3) == ([1, 2, 3], [0, 1, 2])  # only what lies before the pass's own tokens
    missed.clear("a")
    assert "a" not in missed and missed.refeed("a", 8) == ([], [])
    missed.forget({"c": None})
    assert "b" not in missed
