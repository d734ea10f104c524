"""The vLLM adapter's translations and checks, without starting vLLM (``prove.decode.vllm.translate``,
``prove.decode.vllm.backend``): our method and parameters → engine arguments and ``speculative_config``, vLLM's
per-request metrics → our stats, and every bad input refused at start with the fix. The engine itself is exercised
in test_vllm_engine.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prove.common.checkpoint import CONFIG_MASK_KEY, config_mask_id
from prove.decode.config import DecodeConfig, DecodeParams, VllmOptions
from prove.decode.methods import get_method
from prove.decode.vllm import backend as vllm_backend
from prove.decode.vllm.backend import VllmDecoder, start_llm
from prove.decode.vllm.stats import vllm_stats
from prove.decode.vllm.translate import check_vllm_method, engine_args, vllm_methods

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


def plan(model, **kw) -> VllmDecoder:
    return VllmDecoder(model, start=False, **kw)


def test_each_method_maps_onto_its_speculative_config(checkpoints):
    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    assert plan(mars, method="ar").spec is None
    lossless = plan(mars, method="prove-lossless")  # K = the trained block size (prove.json: 4)
    assert lossless.spec == {
        "method": "draft_model",
        "model": mars,
        "num_speculative_tokens": 4,
        "parallel_drafting": True,
    }
    assert plan(mars, method="prove-lossless", block_size=2).spec["num_speculative_tokens"] == 2
    pard = plan(verifier, method="pard", draft=mars)  # a separate block model drafts for the target
    assert pard.spec == {**lossless.spec, "model": mars} and pard.params.block_size == 4
    sd = plan(verifier, method="sd", draft=mars, k=3).spec
    assert sd == {
        "method": "draft_model",
        "model": mars,
        "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic",
    }
    assert "parallel_drafting" not in sd  # the draft proposes token by token


def test_engine_arguments_carry_the_knobs_and_any_engine_argument_wins(checkpoints):
    spec = {"method": "draft_model", "model": "m", "num_speculative_tokens": 4, "parallel_drafting": True}
    opts = VllmOptions(
        max_num_seqs=8, kv_cache_gb=0.5, max_model_len=512, engine_args={"max_num_seqs": 3, "x": 1}
    )
    args = engine_args("m", spec, opts, dtype="auto", device="cpu", seed=7)
    assert args["dtype"] == "float32" and args["seed"] == 7 and args["enforce_eager"] is True
    assert args["kv_cache_memory_bytes"] == 2**29 and args["max_model_len"] == 512
    assert args["speculative_config"] == spec and args["per_request_spec_decode_metrics"] == "detailed"
    assert args["max_num_seqs"] == 3 and args["x"] == 1  # engine_args last
    gpu = engine_args("m", None, VllmOptions(), dtype="auto", device="cuda")
    assert gpu["dtype"] == "auto" and "enforce_eager" not in gpu and "speculative_config" not in gpu


def test_mars_is_refused_on_vllm_saying_why(checkpoints):
    """The reason is the registry's (``Method.vllm_why``), and so is the list of what vLLM runs (``Method.vllm``)."""
    runs = vllm_methods()
    assert set(runs) >= {"ar", "prove-lossless", "sd", "pard", "prove", "nsd", "asd"} and "mars" not in runs
    with pytest.raises(
        ValueError,
        match=r"method=mars runs on our engine only, backend=engine \(the MARS confidence rule commits without any "
        r"verification pass.*on vLLM pick one of " + ", ".join(runs),
    ):
        plan(checkpoints["mars"], method="mars")


def test_prove_nsd_asd_run_our_rule_in_vllms_step_through_the_worker_class(checkpoints, monkeypatch):
    """prove: the small verifier is vLLM's target, the MARS model its parallel drafter; nsd / asd: the draft drafts
    greedily for the target. The plugin comes with the engine (worker_cls + additional_config), not with vLLM."""
    from prove.decode.vllm import plugin as vllm_plugin

    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    prove = plan(mars, method="prove", verifier=verifier, theta=0.3)
    args = prove.engine_args
    assert args["model"] == verifier and prove.spec == {
        "method": "draft_model",
        "model": mars,
        "num_speculative_tokens": 4,
        "parallel_drafting": True,
    }
    assert args["worker_cls"] == "prove.decode.vllm.plugin.RuleCPUWorker"
    assert args["scheduler_cls"] == "prove.decode.vllm.plugin.RuleScheduler"
    assert args["additional_config"][vllm_plugin.CONFIG_KEY] == {
        "method": "prove",
        "theta": 0.3,
        "verifier_rows": len(prove.tokenizer),
    }
    for name in ("nsd", "asd"):
        dec = plan(verifier, method=name, draft=mars, k=3)
        assert dec.spec == {"method": "draft_model", "model": mars, "num_speculative_tokens": 3}
        assert dec.engine_args["worker_cls"].endswith("RuleCPUWorker")
        assert dec.engine_args["scheduler_cls"].endswith("RuleScheduler")
    asd = plan(verifier, method="asd", draft=mars, budget=4.0)
    assert asd.engine_args["additional_config"][vllm_plugin.CONFIG_KEY] == {
        "method": "asd", "budget": 4.0, "gate": 0.25, "max_mismatches": 2
    }  # fmt: skip
    for name in ("ar", "prove-lossless"):
        assert {"worker_cls", "scheduler_cls"}.isdisjoint(
            plan(mars, method=name).engine_args
        )  # nothing changes for vLLM's own methods
    with pytest.raises(ValueError, match="method=prove needs ProVe's small verifier: pass verifier=PATH"):
        plan(mars, method="prove")
    with pytest.raises(ValueError, match="method=nsd on vLLM is greedy"):
        plan(verifier, method="nsd", draft=mars, temperature=0.5)


def test_a_plugin_request_carries_its_rule_parameters(checkpoints):
    pytest.importorskip("vllm", reason="SamplingParams is vLLM's")
    from prove.decode.vllm import plugin as vllm_plugin

    prove = plan(checkpoints["mars"], method="prove", verifier=checkpoints["verifier"], theta=0.3)
    params = prove.sampling_params(8, None, [1], None, DecodeParams(theta=0.05))
    assert params.extra_args == {vllm_plugin.METHOD_ARG: "prove", "theta": 0.05}
    assert prove.sampling_params(8, None, [1], None).extra_args["theta"] == 0.3  # the engine's default
    with pytest.raises(ValueError, match="returns no log-probs"):
        prove.sampling_params(8, None, [1], None, logprobs=2)


def test_an_untested_vllm_version_is_refused_at_start(checkpoints, monkeypatch):
    from prove.decode.vllm import plugin as vllm_plugin

    monkeypatch.setattr(vllm_plugin, "vllm_version", lambda: "0.33.1")
    with pytest.raises(
        ValueError, match=r"tested on vLLM 0\.32\.0 only, and this is vLLM 0\.33\.1: install a tested"
    ):
        VllmDecoder(
            checkpoints["mars"], method="prove", verifier=checkpoints["verifier"]
        )  # before vLLM is imported
    plan(
        checkpoints["mars"], method="prove", verifier=checkpoints["verifier"]
    )  # a plan starts nothing: no check
    with pytest.raises(ValueError, match="tested on vLLM 0.32.0 only"):
        vllm_plugin.check_vllm_version("nsd", "0.31.2")
    vllm_plugin.check_vllm_version("prove", "0.32.0")


def test_a_verifier_with_fewer_rows_is_refused_naming_pad_vocab(checkpoints, tmp_path, make_lm, tokenizer):
    from tests.decode.conftest import save_checkpoint

    short = save_checkpoint(
        tmp_path / "short", make_lm(seed=4, vocab=len(tokenizer) - 2), tokenizer, stage="sft"
    )
    with pytest.raises(ValueError, match=r"vLLM needs them equal\. Pad the verifier: .*pad_vocab\("):
        plan(checkpoints["mars"], method="prove", verifier=short)


def test_each_request_is_checked_against_the_engines_method():
    """The per-request parameters (``vllm_xargs`` on the server) resolve over the engine's defaults by the method's
    own checks; the server's middleware refuses, with a 400 saying why, what the engine would not run."""
    from prove.decode.vllm import plugin as vllm_plugin

    settings = {"method": "prove", "theta": 0.1}
    assert vllm_plugin.resolve_request(settings, None) == {"theta": 0.1}
    assert vllm_plugin.resolve_request(settings, {"theta": 0.4}) == {"theta": 0.4}
    with pytest.raises(ValueError, match="reads theta per request, not other_plugin: drop them"):
        vllm_plugin.resolve_request(settings, {"theta": 0.4, "other_plugin": 1})  # nothing else reads them
    with pytest.raises(
        ValueError, match="this engine runs method=prove .* a request for method=asd needs an engine"
    ):
        vllm_plugin.resolve_request(settings, {vllm_plugin.METHOD_ARG: "asd"})
    with pytest.raises(ValueError, match="reads theta per request, not budget"):
        vllm_plugin.resolve_request(settings, {"budget": 2})
    with pytest.raises(ValueError, match="theta"):
        vllm_plugin.resolve_request({"method": "nsd", "theta": 0.9}, {"theta": 1.5})
    ok = {"temperature": 0, "vllm_xargs": {"theta": 0.2}}
    assert vllm_plugin.check_request("prove", ok) is None
    assert "is greedy" in vllm_plugin.check_request("prove", {"vllm_xargs": {"theta": 0.2}})
    assert "no log-probs" in vllm_plugin.check_request("prove", {**ok, "logprobs": 2})
    assert "method=nsd needs an engine" in vllm_plugin.check_request(
        "prove", {**ok, "vllm_xargs": {"prove_method": "nsd"}}
    )
    assert callable(vllm_plugin.check_asd_requests) and vllm_plugin.middleware("asd").endswith(
        ".check_asd_requests"
    )


def test_the_plugin_module_imports_no_vllm():
    """vLLM's processes import it by name (the worker class, the middleware); the modules that subclass vLLM's
    pieces load on first access, in the engine's process: the package, the plugin's core and the server's gate
    import no vLLM (nor does reading the registry through them)."""
    code = (
        "import sys, prove.decode, prove.decode.vllm, prove.decode.vllm.plugin as p, prove.decode.vllm.gate as g; "
        "p.check_prove_requests; g.check_asd_requests; p.rule_keys('asd'); p.plugin_methods(); "
        "assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_engine_only_settings_are_refused():
    m = get_method("prove-lossless")
    with pytest.raises(ValueError, match="fuse=true is our engine's fused cycle"):
        check_vllm_method(m, DecodeParams(fuse=True))
    with pytest.raises(
        ValueError, match="compile=true compiles our engine's fast cycle: drop it with backend=vllm"
    ):
        check_vllm_method(get_method("ar"), DecodeParams(compile=True))
    with pytest.raises(ValueError, match="proposer=block composes rules on our engine"):
        check_vllm_method(get_method("nsd"), DecodeParams(), proposer="block")
    with pytest.raises(ValueError, match="trace=true"):
        check_vllm_method(m, DecodeParams(), trace=True)
    with pytest.raises(ValueError, match="backend='gpu': pick one of engine, vllm"):
        DecodeConfig(model="m", prompts="p", output="o", backend="gpu")
    with pytest.raises(ValueError, match="vllm.concurrency=0 must be ≥ 1"):
        VllmOptions(concurrency=0)


def test_bad_checkpoints_are_refused_before_any_engine_starts(checkpoints):
    with pytest.raises(ValueError, match=r"has no <\|mask\|> token: train it with `prove-train stage=mars`"):
        plan(checkpoints["stock"], method="prove-lossless")
    with pytest.raises(ValueError, match="block_size=8 exceeds the block size 4 .*pass block_size=4 or less"):
        plan(checkpoints["mars"], method="prove-lossless", block_size=8)
    with pytest.raises(ValueError, match="block_size=8 exceeds the block size 4"):
        plan(checkpoints["verifier"], method="pard", draft=checkpoints["mars"], block_size=8)
    with pytest.raises(ValueError, match="method=sd needs a draft model: pass draft=PATH"):
        plan(checkpoints["mars"], method="sd")
    with pytest.raises(ValueError, match="tokenizer differs from model"):
        plan(checkpoints["mars"], method="sd", draft=checkpoints["alien"])
    with pytest.raises(ValueError, match="greedy"):
        plan(checkpoints["mars"], method="prove-lossless", temperature=0.8)
    with pytest.raises(
        ValueError, match="temperature=0.8 on vLLM's CPU build: its speculative sampling does not"
    ):
        plan(checkpoints["mars"], method="sd", draft=checkpoints["verifier"], temperature=0.8)
    sd = plan(checkpoints["mars"], method="sd", draft=checkpoints["verifier"], temperature=0.8, device="cuda")
    assert sd.spec["draft_sample_method"] == "probabilistic"  # on a GPU build: vLLM's speculative sampling
    plan(checkpoints["mars"], method="ar", temperature=0.8)  # plain sampling: exact on any build


def test_vllm_not_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm → ImportError
    with pytest.raises(ValueError, match=r"backend=vllm needs vLLM, which is not installed .*`make install`"):
        start_llm({"model": "m"})


def test_an_older_block_checkpoint_gets_its_mask_id_in_config_json(tmp_path, checkpoints, monkeypatch):
    import shutil

    ckpt = tmp_path / "old"
    shutil.copytree(checkpoints["mars"], ckpt)
    mask_id = config_mask_id(ckpt)
    assert mask_id is not None  # written with prove.json (tests/decode/conftest.py: write_prove_json)
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg[CONFIG_MASK_KEY]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match=rf"added mask_token_id={mask_id} to .*config.json"):
        plan(str(ckpt), method="prove-lossless")
    assert config_mask_id(ckpt) == mask_id
    assert json.loads((ckpt / "config.json").read_text())["vocab_size"] == cfg["vocab_size"]  # the rest kept
    # a checkpoint that cannot be written (a read-only mount): the error says what to add
    (ckpt / "config.json").write_text(json.dumps(cfg))

    def read_only(*args):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(vllm_backend, "write_config_mask_id", read_only)
    with pytest.raises(
        ValueError, match=rf'read-only file system\): add "mask_token_id": {mask_id} to .*config.json'
    ):
        plan(str(ckpt), method="prove-lossless")


def test_the_allowed_ids_leave_out_the_mask_and_rows_past_the_tokenizer(checkpoints):
    dec = plan(checkpoints["mars"], method="prove-lossless")
    vocab = dec.tokenizer.get_vocab()
    mask = vocab["<|mask|>"]
    assert dec.allowed == sorted(set(vocab.values()) - {mask})  # every text id, never the placeholder


def test_vllm_stats_count_only_committed_tokens_as_ours():
    # prefill token, then steps accepting 2, 0, 3 of 3 drafts (+ bonus each): 1 + 3 + 1 + 4 = 9 committed, but
    # max_new_tokens = 7 cut the last step to 2 tokens: two of its accepted drafts, no bonus
    spec = {
        "num_spec_steps": 3,
        "num_draft_tokens": 9,
        "num_accepted_draft_tokens": 5,
        "mean_acceptance_length": 1 + 5 / 3,
        "per_step_accepted": [2, 0, 3],
        "per_step_drafted": [3, 3, 3],
    }
    s = vllm_stats(7, spec, wall_s=0.5)
    assert s.committed_per_cycle == [1, 3, 1, 2] and sum(s.committed_per_cycle) == 7
    assert s.cycles == 4 and s.tokens_per_cycle == 7 / 4
    assert s.proposed_by_depth == [3, 3, 3] and s.accepted_by_depth == [2, 2, 0]
    assert (s.drafts, s.draft_tokens, s.accepted_tokens) == (3, 9, 5)  # vLLM's own, uncut
    assert s.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    uncut = vllm_stats(9, spec, 0.5)
    assert uncut.committed_per_cycle == [1, 3, 1, 4] and uncut.accepted_by_depth == [2, 2, 1]
    dropped = vllm_stats(5, spec, 0.5)  # the whole last step cut
    assert dropped.committed_per_cycle == [1, 3, 1] and dropped.proposed_by_depth == [2, 2, 2]
    # prove: rows of m accepted drafts and no bonus, which vLLM counts as m - 1 accepted (its row less a bonus)
    rows = {
        **spec,
        "per_step_accepted": [1, 0, 3],
        "per_step_drafted": [4, 4, 4],
    }  # rows of 2, 1 and 4 drafts
    prove = vllm_stats(8, rows, 0.5, bonus=False)
    assert prove.committed_per_cycle == [1, 2, 1, 4] and prove.accepted_by_depth == [3, 2, 1, 1]
    assert prove.proposed_by_depth == [3, 3, 3, 3]
    cut = vllm_stats(6, rows, 0.5, bonus=False)  # max_new_tokens inside the last block: 2 of its 4 drafts
    assert cut.committed_per_cycle == [1, 2, 1, 2] and cut.accepted_by_depth == [3, 2, 0, 0]
    # with the request's limit: what our engine proposes, no more than max_new_tokens leaves (less the bonus)
    limited = vllm_stats(7, spec, 0.5, max_new_tokens=7)  # steps after 1, 4 and 5 tokens: 3, 2 and 1 drafts
    assert limited.proposed_by_depth == [3, 2, 1] and limited.accepted_by_depth == [2, 1, 0]
    assert limited.committed_per_cycle == [1, 3, 1, 2]
    assert limited.proposed_per_cycle == [3, 2, 1]  # each verification step's K, as our engine proposes it
    scheduled = vllm_stats(8, {**spec, "per_step_drafted": [3, 1, 2], "per_step_accepted": [2, 0, 2]}, 0.5)
    assert scheduled.proposed_per_cycle == [3, 1, 2]  # a K schedule's steps: the K our engine replays
    # K = 0 steps of a schedule are not in vLLM's per-step figures: 8 committed by prefill + drafting steps, 4 more
    # tokens came one a step (without them tokens/cycle would read 12 / 4)
    zeros = vllm_stats(12, {**spec, "per_step_drafted": [3, 1, 2], "per_step_accepted": [2, 0, 2]}, 0.5)
    assert zeros.cycles == 8 and zeros.tokens_per_cycle == 12 / 8
    assert zeros.committed_per_cycle == [1, 3, 1, 3, 1, 1, 1, 1] and zeros.proposed_per_cycle == [
        3,
        1,
        2,
        0,
        0,
        0,
        0,
    ]
    assert zeros.proposed_by_depth == [3, 2, 1] and zeros.accepted_by_depth == [2, 2, 0]
    assert vllm_stats(9, spec, 0.5, max_new_tokens=20).proposed_by_depth == [3, 3, 3]
    limited = vllm_stats(6, rows, 0.5, bonus=False, max_new_tokens=6)  # prove: no bonus, 4, 3 and 2 drafts
    assert limited.proposed_by_depth == [3, 3, 2, 1] and limited.accepted_by_depth == [3, 2, 0, 0]
    ar = vllm_stats(5, None, 0.1)
    assert (
        ar.cycles == 5 and ar.tokens_per_cycle == 1.0 and ar.drafts == 0 and ar.to_dict()["backend"] == "vllm"
    )


def test_prove_serve_builds_the_server_command_and_refuses_what_vllm_cannot_run(checkpoints):
    from prove.decode.vllm.serve import ServeConfig, server_argv

    argv, args = server_argv(ServeConfig(model=checkpoints["mars"], method="prove-lossless", port=8123))
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enforce-eager" in argv
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == args["speculative_config"] and spec["parallel_drafting"] is True
    assert spec["num_speculative_tokens"] == 4 and argv[argv.index("--dtype") + 1] == "float32"
    with pytest.raises(ValueError, match="method=mars runs on our engine only, backend=engine"):
        server_argv(ServeConfig(model=checkpoints["mars"], method="mars"))
    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    argv, args = server_argv(ServeConfig(model=mars, verifier=verifier, method="prove", theta=0.2))
    assert argv[argv.index("--model") + 1] == verifier and args["served_model_name"] == mars
    assert argv[argv.index("--worker-cls") + 1] == "prove.decode.vllm.plugin.RuleCPUWorker"
    assert argv[argv.index("--scheduler-cls") + 1] == "prove.decode.vllm.plugin.RuleScheduler"
    assert argv[argv.index("--middleware") + 1] == "prove.decode.vllm.plugin.check_prove_requests"
    assert json.loads(argv[argv.index("--additional-config") + 1])["prove_rule"]["theta"] == 0.2
    with pytest.raises(ValueError, match="port=0 must lie in 1..65535"):
        ServeConfig(model="m", port=0)


def test_a_plugin_engines_token_budget_covers_every_running_requests_block(checkpoints):
    """vLLM trims a running request's drafts to what is left of a step's token budget, which would cut a block
    short of our rule's K under load: a plugin engine gets ``max_num_seqs`` × (1 + K + drafter slots) where vLLM's
    smallest default is less, and a smaller budget of the user's is refused. Fails if the budget is left to vLLM's
    default (2048 on a CPU server) at 256 sequences of K = 4, or an insufficient one passes."""
    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    prove = plan(mars, method="prove", verifier=verifier)  # K = 4, parallel: 4 slots; 256 sequences
    assert prove.engine_args["max_num_batched_tokens"] == 256 * (1 + 4 + 4)
    asd = plan(verifier, method="asd", draft=mars, k=3, options=VllmOptions(max_num_seqs=64))
    assert "max_num_batched_tokens" not in asd.engine_args  # 64 × (1 + 3 + 1) fits vLLM's default
    assert (
        "max_num_batched_tokens" not in plan(mars, method="prove-lossless").engine_args
    )  # vLLM's own: as it is
    small = VllmOptions(engine_args={"max_num_batched_tokens": 1024})
    with pytest.raises(ValueError, match="set vllm.engine_args.max_num_batched_tokens=2304 or more"):
        plan(mars, method="prove", verifier=verifier, options=small)


def test_the_vllm_internals_the_plugin_subclasses_are_where_it_expects():
    """A vLLM upgrade that moves them fails here, loudly, not inside an engine (the plugin is pinned too)."""
    pytest.importorskip("vllm", reason="the plugin subclasses vLLM's classes")
    import inspect

    from prove.decode.vllm import plugin as vllm_plugin
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.worker.cpu_worker import CPUWorker

    assert issubclass(vllm_plugin.RuleCPUWorker, CPUWorker) and issubclass(
        vllm_plugin.RuleSampler, RejectionSampler
    )
    assert issubclass(vllm_plugin.RuleDrafter, DraftModelProposer)
    assert list(inspect.signature(RejectionSampler.forward).parameters) == [
        "self", "metadata", "draft_probs", "logits", "sampling_metadata"
    ]  # fmt: skip
    assert list(inspect.signature(DraftModelProposer._sample_draft_tokens).parameters) == [
        "self", "hidden_states", "sampling_metadata"
    ]  # fmt: skip
    assert "init_device" in vars(CPUWorker) and vllm_plugin.vllm_version() in vllm_plugin.TESTED_VLLM
    assert issubclass(vllm_plugin.RuleScheduler, Scheduler)
    for name, params in (
        ("_preempt_request", ["self", "request", "timestamp", "drop_stale_output"]),
        ("_update_after_schedule", ["self", "scheduler_output"]),
        ("update_draft_token_ids", ["self", "draft_token_ids"]),
        ("update_from_output", ["self", "scheduler_output", "model_runner_output"]),
        ("add_request", ["self", "request"]),
        ("finish_requests", ["self", "request_ids", "finished_status"]),
    ):  # the scheduler's hooks RuleScheduler overrides or calls
        assert list(inspect.signature(getattr(Scheduler, name)).parameters) == params, name
    from vllm.v1.engine import EngineCoreOutput, FinishReason
    from vllm.v1.request import RequestStatus

    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_ERROR) == FinishReason.ERROR
    assert {"request_id", "new_token_ids", "finish_reason", "events", "trace_headers"} <= set(
        EngineCoreOutput.__struct_fields__
    )  # what RuleScheduler sends for a request it refuses on arrival
    assert issubclass(vllm_plugin.ScheduledDrafter, DraftModelProposer)
    assert list(inspect.signature(DraftModelProposer.propose).parameters)[:9] == [
        "self", "num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
        "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
    ]  # fmt: skip
    import dataclasses

    from vllm.v1.attention.backend import CommonAttentionMetadata

    fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    assert {"query_start_loc", "query_start_loc_cpu", "num_actual_tokens", "max_query_len", "slot_mapping",
            "positions", "block_table_tensor", "_num_computed_tokens_cache", "_token_to_req_indices_cache"} <= fields  # fmt: skip
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    init = inspect.getsource(
        SpecDecodeBaseProposer.__init__
    )  # the slot counts ScheduledDrafter sets per step
    assert "self.extra_slots_per_request =" in init and "self.net_num_new_slots_per_request =" in init
    source = inspect.getsource(Request.__init__)
    for attr in ("skip_reading_prefix_cache", "spec_decode_metrics", "is_prefill_chunk", "num_output_tokens"):
        assert f"self.{attr}" in source or hasattr(Request, attr), (
            attr
        )  # the request's fields RuleScheduler reads and sets
