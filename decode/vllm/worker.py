"""The plugin's workers (``prove.decode.vllm.plugin``): vLLM's CPU and GPU workers, subclassed, the ``worker_cls`` of
an engine started with the plugin (``plugin.worker_cls``). When the device is initialised, :func:`install_rule` swaps
our drafter (:mod:`.drafter`) and, for a method whose rule the plugin runs (``OnVllm.plugin``), our sampler
(:mod:`.sampler`) into the worker's model runner, before its weights load.

vLLM is imported here: this module loads in the engine's process (vLLM resolves ``worker_cls``)."""

from __future__ import annotations

from typing import Any

from prove.decode.vllm.drafter import RuleDrafter, ScheduledDrafter
from prove.decode.vllm.plugin import CONFIG_KEY, check_vllm_version, on_vllm, vllm_version, worker_cls
from prove.decode.vllm.sampler import RuleSampler
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker


def install_rule(worker: Any) -> None:
    """Swap our drafter and sampler into the worker's model runner (before its weights load)."""
    config = worker.vllm_config
    settings = (config.additional_config or {}).get(CONFIG_KEY)
    if settings is None:
        raise ValueError(
            f"worker_cls={worker_cls(True)} needs additional_config={{{CONFIG_KEY!r}: ...}} (VllmDecoder and "
            "prove-serve pass it): start the engine through them"
        )
    method = settings["method"]
    check_vllm_version(method)
    if config.scheduler_config.async_scheduling:
        # async scheduling hands the sampler rows whose output_token_ids end in placeholders: the length cut
        # (_cut) and ASD's gate would read the wrong length (docs/vllm.md, "Async scheduling")
        raise ValueError(
            f"method={method} on vLLM needs async_scheduling=False (VllmDecoder and prove-serve set "
            "it): drop engine_args.async_scheduling"
        )
    spec = config.speculative_config
    runner = worker.model_runner
    if not on_vllm(method).plugin:  # vLLM's own rule under a K schedule: our drafter only
        if not isinstance(getattr(runner, "drafter", None), DraftModelProposer):
            raise RuntimeError(
                f"prove plugin: vLLM {vllm_version()}'s model runner ({type(runner).__name__}) has no V1 "
                "draft-model drafter to replace (its V2 runner is not supported)"
            )
        runner.drafter = ScheduledDrafter(vllm_config=config, device=runner.device, runner=runner)
        return
    if spec is None or not spec.uses_draft_model():
        raise ValueError(f"method={method} on vLLM needs speculative_config method=draft_model")
    drafter = getattr(runner, "drafter", None)
    if not hasattr(runner, "rejection_sampler") or not isinstance(drafter, DraftModelProposer):
        raise RuntimeError(
            f"prove plugin: vLLM {vllm_version()}'s model runner ({type(runner).__name__}) has no V1 "
            "rejection_sampler / draft-model drafter to replace (its V2 runner is not supported)"
        )
    drafter = RuleDrafter(vllm_config=config, device=runner.device, runner=runner)
    runner.drafter = drafter
    runner.rejection_sampler = RuleSampler(
        runner.sampler, spec, runner.device, settings=settings, runner=runner, drafter=drafter
    )


def with_rule(base: type) -> type:
    """``base`` (a vLLM worker class) with :func:`install_rule` run when its device is initialised."""

    class RuleWorker(base):  # type: ignore[misc,valid-type]
        """vLLM's worker, with our rule installed in its model runner (``prove.decode.vllm.plugin``)."""

        def init_device(self) -> None:
            super().init_device()
            install_rule(self)

        def drafter_counts(self) -> dict[str, int] | None:
            """A :class:`~prove.decode.vllm.drafter.ScheduledDrafter`'s passes run, passes skipped (K = 0) and tokens
            re-fed after them (``LLM.collective_rpc("drafter_counts")``), or None for another drafter."""
            drafter = getattr(self.model_runner, "drafter", None)
            if not isinstance(drafter, ScheduledDrafter):
                return None
            return {"passes": drafter.passes, "skipped": drafter.skipped, "refed": drafter.refed}

    RuleWorker.__name__ = RuleWorker.__qualname__ = f"Rule{base.__name__}"
    return RuleWorker


RuleCPUWorker = with_rule(CPUWorker)
RuleGPUWorker = with_rule(Worker)
