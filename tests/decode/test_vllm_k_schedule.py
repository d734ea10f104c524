"""vLLM 0.32's batch-size schedule of K with parallel drafting (docs/vllm.md, "Under load"): the adapter warns that it
misassigns drafts below the K the drafter was built with and still runs the drafter at K = 0 (measured on the demo's
checkpoint: tests cannot time it)."""

from __future__ import annotations

import warnings

import pytest
from prove.decode.config import VllmOptions
from prove.decode.vllm.backend import VllmDecoder

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


def test_a_k_schedule_with_parallel_drafting_is_warned_about(checkpoints):
    mars = checkpoints["mars"]
    spec = {"method": "draft_model", "model": mars, "num_speculative_tokens": 4, "parallel_drafting": True}
    schedule = {**spec, "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]]}
    with pytest.warns(UserWarning, match="misassigns drafts across a batch's requests, and K = 0 still runs"):
        plan = VllmDecoder(
            mars, start=False, options=VllmOptions(engine_args={"speculative_config": schedule})
        )
    assert plan.engine_args["speculative_config"] == schedule  # passed on as asked: vLLM runs it, losslessly
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        VllmDecoder(mars, start=False)  # the static K: no warning
        sd = {"method": "draft_model", "model": mars, "num_speculative_tokens": 3}
        VllmDecoder(mars, start=False, options=VllmOptions(engine_args={"speculative_config": {**sd, "num_speculative_tokens_per_batch_size": [[1, 256, 2]]}}))  # fmt: skip
